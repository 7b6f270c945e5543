{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "llm-canary.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, with the chart name unless it already has it. */}}
{{- define "llm-canary.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llm-canary.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-canary.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llm-canary.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "llm-canary.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llm-canary
{{- end }}

{{- define "llm-canary.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llm-canary.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The kubernetes discovery section of the config, or an empty dict. */}}
{{- define "llm-canary.kube" -}}
{{- $d := .Values.config.discovery | default dict }}
{{- toYaml ($d.kubernetes | default dict) }}
{{- end }}

{{/* Namespaces discovery watches: the configured ones, else the release namespace (as the daemon). */}}
{{- define "llm-canary.watchedNamespaces" -}}
{{- $k := include "llm-canary.kube" . | fromYaml }}
{{- $ns := concat ($k.namespaces | default list) (ternary (list $k.namespace) list (hasKey $k "namespace")) }}
{{- if not $ns }}{{ $ns = list .Release.Namespace }}{{ end }}
{{- toJson (uniq $ns) }}
{{- end }}
