#!/usr/bin/env python3
"""Renders and lints helm/llm-canary with the real Helm library (PyPI helm-python-sdk, Helm v4,
offline) for the default values and every ci/*-values.yaml, and checks what comes out:

- lint has no warning or error;
- every object validates strictly against the Kubernetes schemas (kubernetes-validate), and the
  ServiceMonitor and PrometheusRule against the prometheus-operator CRDs' openAPIV3Schema
  (tests/testdata/crds), with unknown fields rejected;
- the Deployment is hardened and probed, RBAC grants exactly what the daemon uses, every
  dashboard in dashboards/ becomes a labelled ConfigMap with the file's bytes;
- the lifecycle endpoints are off by default; enabled with a token Secret
  (ci/lifecycle-values.yaml) the config names the mounted file; the NetworkPolicy admits only
  the Prometheus pods it selects;
- for the deploy guide's values (examples/k8s/canary-values.yaml) the rendered config passes
  `llm-canary check`;
- for the default values: the rendered config passes `llm-canary check` and names the
  PrometheusRule the daemon keeps and its state ConfigMap; Helm renders no SLO PrometheusRule of
  its own (it could go stale), and with changed SLO values the rendered config carries the change
  and `llm-canary rules` on it (what the daemon writes) the changed rule;
- with `prometheusRule.managed: false` (ci/unmanaged-rules-values.yaml) the SLO PrometheusRule's
  spec equals `llm-canary rules --format prometheus-rule` for the config, and every rendered
  rule group passes `promtool check rules`.

Usage: test_chart.py --bin target/debug/llm-canary   (run from the repository root)
Exits 1 with every failure listed.
"""
import argparse
import copy
import glob
import os
import subprocess
import sys
import tempfile

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

CHART = "helm/llm-canary"
RELEASE, NAMESPACE = "canary", "monitoring"
KUBE_VERSION = "1.30.0"
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def strict_schema(schema):
    """The CRD schema with unknown fields rejected wherever it lists properties, as the API
    server's pruning would silently drop them (a typo would then go unnoticed)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def crd_schemas():
    out = {}
    for path in glob.glob("tests/testdata/crds/*.yaml"):
        crd = yaml.safe_load(open(path))
        kind = crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            out[(f"{crd['spec']['group']}/{v['name']}", kind)] = strict_schema(
                v["schema"]["openAPIV3Schema"])
    return out


def render(values_file, extra=None):
    values = helm.values_from_yaml(open(values_file).read()) if values_file else None
    if extra is not None:
        values = helm.values_from_yaml(yaml.safe_dump(extra))
    report = helm.lint(CHART, values, strict=False, kube_version=f"v{KUBE_VERSION}")
    for m in report["messages"]:
        # Severity 1 is INFO (e.g. "icon is recommended"); warnings and errors fail.
        check(m["severity"] < 2, f"lint {m['path']}: {m['error']}")
    check(not report["errors"], f"lint errors: {report['errors']}")
    out = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE,
                                        is_install=True)
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith((".yaml", ".yml")):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    notes = [t for n, t in out.items() if n.endswith("NOTES.txt")]
    check(notes and "port-forward" in notes[0], "NOTES.txt renders")
    return docs


def validate(docs, crds, label):
    for d in docs:
        key = (d["apiVersion"], d["kind"])
        name = f"{label}: {d['kind']}/{d['metadata']['name']}"
        if key in crds:
            # OpenAPI v3 schemas are draft-4-like; not check_schema(): some CRD patterns are Go
            # regexes (`^(?i)...`) Python's `re` rejects, on fields we never set.
            for e in jsonschema.Draft7Validator(crds[key]).iter_errors(d):
                failures.append(f"{name}: {e.message} at {list(e.absolute_path)}")
        else:
            try:
                kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
            except Exception as e:  # ValidationError or SchemaNotFoundError: both fail
                failures.append(f"{name}: {str(e).splitlines()[0]}")


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def check_deployment(docs, label):
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    check(sc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem")
          and sc.get("allowPrivilegeEscalation") is False
          and sc.get("capabilities", {}).get("drop") == ["ALL"]
          and sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
          f"{label}: container securityContext not hardened: {sc}")
    check(pod["securityContext"].get("runAsNonRoot") is True, f"{label}: pod not non-root")
    check(c["livenessProbe"]["httpGet"]["path"] == "/-/healthy", f"{label}: liveness probe")
    check(c["readinessProbe"]["httpGet"]["path"] == "/-/ready", f"{label}: readiness probe")
    args = c["args"]
    check(args[:2] == ["run", "--config"] and "--listen" in args
          and args[args.index("--listen") + 1] == "0.0.0.0:9464", f"{label}: args {args}")
    check("limits" in c["resources"] and "requests" in c["resources"], f"{label}: resources")
    env = {e["name"] for e in c["env"]}
    check({"POD_NAME", "POD_NAMESPACE", "POD_UID"} <= env, f"{label}: downward API env {env}")


def rbac_rules(docs):
    out = {}
    for r in by_kind(docs, "Role"):
        for rule in r["rules"]:
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    out.setdefault((r["metadata"]["namespace"], g, res), set()).update(rule["verbs"])
    return out


def check_rbac(docs, config, label):
    rules = rbac_rules(docs)
    check(not by_kind(docs, "ClusterRole"), f"{label}: no ClusterRole")
    kube = (config.get("discovery") or {}).get("kubernetes")
    if kube is None:
        check(not rules, f"{label}: RBAC without discovery: {rules}")
        return
    namespaces = sorted(set(kube.get("namespaces") or []) | ({kube["namespace"]} if kube.get("namespace") else set())) or [NAMESPACE]
    for ns in namespaces:
        check(rules.get((ns, "nvidia.com", "dynamographdeployments")) == {"get", "list", "watch"},
              f"{label}: DGD verbs in {ns}: {rules.get((ns, 'nvidia.com', 'dynamographdeployments'))}")
        check(rules.get((ns, "", "pods")) == {"get", "list", "watch"}, f"{label}: pod verbs in {ns}")
        check(rules.get((ns, "events.k8s.io", "events")) == {"create", "patch"}, f"{label}: event verbs in {ns}")
    check(rules.get((NAMESPACE, "events.k8s.io", "events")) == {"create", "patch"},
          f"{label}: Events on the canary's own Pod")
    le = kube.get("leader_election")
    if le:
        verbs = rules.get((le.get("namespace") or NAMESPACE, "coordination.k8s.io", "leases"))
        want = {"get", "create", "patch"} | ({"list"} if le.get("sharding") else set())
        check(verbs == want, f"{label}: lease verbs {verbs} != {want}")
    for key, group, res in (("state_configmap", "", "configmaps"),
                            ("prometheus_rule", "monitoring.coreos.com", "prometheusrules")):
        verbs = rules.get((NAMESPACE, group, res))
        if kube.get(key):
            check(verbs == {"create", "get", "patch"}, f"{label}: {res} verbs {verbs}")
        else:
            check(verbs is None, f"{label}: {res} granted without {key}")
    pause = kube.get("pause_annotation_on")
    deployments = [rule for r in by_kind(docs, "Role") for rule in r["rules"]
                   if "deployments" in rule["resources"]]
    if pause:
        check(pause == f"{RELEASE}-llm-canary", f"{label}: pause annotation on {pause}")
        check([(d["verbs"], d.get("resourceNames")) for d in deployments]
              == [(["get", "list", "watch"], [pause])],
              f"{label}: the pause annotation's Deployment only: {deployments}")
    else:
        check(not deployments, f"{label}: Deployments granted without pause_annotation_on")
    allowed = {"dynamographdeployments", "pods", "events", "leases", "configmaps", "prometheusrules",
               "deployments"}
    check(all(res in allowed for (_, _, res) in rules), f"{label}: extra RBAC resources {rules}")


def check_lifecycle(docs, values, label):
    """The state-changing endpoints are off unless enabled; an enabled token comes from a mounted
    Secret, never the ConfigMap; the NetworkPolicy admits only the selected scrapers."""
    config = yaml.safe_load(config_of(docs))
    export = config.get("export") or {}
    lifecycle = values.get("lifecycle") or {}
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if not lifecycle.get("enabled"):
        check(not export.get("lifecycle"), f"{label}: lifecycle on by default: {export}")
        check("lifecycle-token" not in volumes, f"{label}: a token mounted with lifecycle off")
    else:
        check(export.get("lifecycle") is True, f"{label}: lifecycle enabled but not in the config")
        secret = (lifecycle.get("tokenSecret") or {}).get("name")
        if secret:
            key = lifecycle["tokenSecret"].get("key", "token")
            path = f"{mounts['lifecycle-token']['mountPath']}/{key}" if "lifecycle-token" in mounts else None
            check(export.get("lifecycle_token_file") == path,
                  f"{label}: token file {export.get('lifecycle_token_file')} != mounted {path}")
            check(volumes.get("lifecycle-token", {}).get("secret", {}).get("secretName") == secret,
                  f"{label}: token Secret {secret} not mounted: {volumes.get('lifecycle-token')}")
            check(mounts.get("lifecycle-token", {}).get("readOnly") is True, f"{label}: token mount writable")
    policies = by_kind(docs, "NetworkPolicy")
    if (values.get("networkPolicy") or {}).get("enabled"):
        (np,) = policies
        (ingress,) = np["spec"]["ingress"]
        check(ingress.get("from") == values["networkPolicy"]["metricsFrom"],
              f"{label}: ingress from {ingress.get('from')}")
        check(all("podSelector" in f and "namespaceSelector" in f for f in ingress.get("from", [])),
              f"{label}: ingress not limited to Prometheus pods: {ingress.get('from')}")
    else:
        check(not policies, f"{label}: NetworkPolicy rendered while disabled")


def check_dashboards(docs, values, label):
    files = sorted(glob.glob("dashboards/*.json"))
    cms = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    if not values.get("dashboards", {}).get("enabled", True):
        check(not cms, f"{label}: dashboards disabled but rendered")
        return
    check(len(cms) == len(files), f"{label}: {len(cms)} dashboard ConfigMaps for {len(files)} files")
    data = {k: v for cm in cms for k, v in cm["data"].items()}
    for f in files:
        body = open(f).read()
        check(data.get(os.path.basename(f), "").strip() == body.strip(), f"{label}: {f} not shipped as is")


def check_monitoring(docs, values, label):
    release = (values.get("serviceMonitor", {}).get("additionalLabels") or {}).get("release")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        for d in by_kind(docs, kind):
            if release:
                check(d["metadata"]["labels"].get("release") == release, f"{label}: {kind} release label")


def config_of(docs):
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    return cm["data"]["config.yaml"]


def slo_rules(docs):
    return [d for d in by_kind(docs, "PrometheusRule")
            if d["metadata"]["labels"].get("app.kubernetes.io/component") == "slo-rules"]


def generated(binary, config_text, tmp):
    cfg = os.path.join(tmp, "config.yaml")
    open(cfg, "w").write(config_text)
    r = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True)
    check(r.returncode == 0, f"rendered config fails `llm-canary check`: {r.stdout}{r.stderr}")
    r = subprocess.run([binary, "rules", "--config", cfg, "--format", "prometheus-rule"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"`llm-canary rules` failed: {r.stderr}")
    return yaml.safe_load(r.stdout) if r.returncode == 0 else None


def check_example_config(config_text, binary, label):
    """The deploy guide's values render a config that `llm-canary check` accepts (every file in
    examples/ passes `check`: tests/config_fixtures.rs checks the configs, this the values)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "config.yaml")
        open(cfg, "w").write(config_text)
        r = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True)
        check(r.returncode == 0, f"{label}: rendered config fails `llm-canary check`: {r.stdout}{r.stderr}")


def promtool_check(docs, tmp):
    for d in by_kind(docs, "PrometheusRule"):
        path = os.path.join(tmp, d["metadata"]["name"] + ".yaml")
        yaml.safe_dump(d["spec"], open(path, "w"))
        p = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
        check(p.returncode == 0, f"promtool check rules {d['metadata']['name']}: {p.stdout}{p.stderr}")


def check_managed_rules(docs, binary):
    """Default values: the daemon keeps the SLO rules, Helm renders none that could go stale."""
    config = yaml.safe_load(config_of(docs))
    kube = config["discovery"]["kubernetes"]
    check(kube.get("prometheus_rule", {}).get("name") == f"{RELEASE}-llm-canary-slos",
          f"the config names the managed PrometheusRule: {kube.get('prometheus_rule')}")
    check(kube.get("state_configmap") == f"{RELEASE}-llm-canary-state",
          f"the config names the state ConfigMap: {kube.get('state_configmap')}")
    check(not slo_rules(docs), "Helm renders an SLO PrometheusRule although the daemon keeps it")
    with tempfile.TemporaryDirectory() as tmp:
        generated(binary, config_of(docs), tmp)
        promtool_check(docs, tmp)
    # Changed SLO values: the rendered config carries them, and so do the rules the daemon writes.
    changed = yaml.safe_load(open(f"{CHART}/values.yaml"))["config"]["slos"]
    for s in changed:
        if s["name"] == "ttft-p99-aggregated":
            s["expr"] = s["expr"].replace("<= 2s", "<= 1500ms")
    docs = render(None, {"config": {"slos": changed}})
    text = config_of(docs)
    check("<= 1500ms" in text, "changed SLO values reach the rendered config")
    check(not slo_rules(docs), "changed SLO values render a stale SLO PrometheusRule")
    with tempfile.TemporaryDirectory() as tmp:
        rules = generated(binary, text, tmp)
        if rules:
            (group,) = [g for g in rules["spec"]["groups"]
                        if g["name"] == "llm-canary-slo-ttft-p99-aggregated"]
            texts = yaml.safe_dump(group)
            check("<= 1.5s" in texts and "<= 2s" not in texts,
                  "the rules for changed SLO values carry the change")


def check_bundled_rules(docs, binary):
    """managed: false: Helm renders the rules, equal to `llm-canary rules` for the config."""
    with tempfile.TemporaryDirectory() as tmp:
        rules = generated(binary, config_of(docs), tmp)
        rendered = slo_rules(docs)
        if check(len(rendered) == 1, f"one SLO PrometheusRule rendered, not {len(rendered)}") and rules:
            check(rendered[0]["spec"] == rules["spec"],
                  "rendered SLO PrometheusRule spec differs from `llm-canary rules --format prometheus-rule`")
        promtool_check(docs, tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    a = ap.parse_args()
    crds = crd_schemas()
    check(len(crds) >= 2, "CRD schemas in tests/testdata/crds")
    # The deploy guide's values are rendered like the chart's own CI values.
    cases = [None] + sorted(glob.glob(f"{CHART}/ci/*-values.yaml")) + ["examples/k8s/canary-values.yaml"]
    check(len(cases) >= 4, "several ci/*-values.yaml")
    defaults = yaml.safe_load(open(f"{CHART}/values.yaml"))
    for case in cases:
        label = os.path.basename(case) if case else "default values"
        overrides = yaml.safe_load(open(case)) if case else {}
        values = copy.deepcopy(defaults)
        for k, v in overrides.items():
            if isinstance(v, dict) and isinstance(values.get(k), dict):
                values[k] = {**values[k], **v}
            else:
                values[k] = v
        try:
            docs = render(case)
        except helm.HelmError as e:
            failures.append(f"{label}: render: {e}")
            continue
        validate(docs, crds, label)
        check_deployment(docs, label)
        (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
        check_rbac(docs, yaml.safe_load(cm["data"]["config.yaml"]), label)
        check_dashboards(docs, values, label)
        check_lifecycle(docs, values, label)
        check_monitoring(docs, values, label)
        if case is None:
            check_managed_rules(docs, a.bin)
        elif case.startswith("examples/"):
            check_example_config(cm["data"]["config.yaml"], a.bin, label)
        elif case.endswith("unmanaged-rules-values.yaml"):
            check_bundled_rules(docs, a.bin)
        print(f"{label}: {len(docs)} objects: " + ", ".join(sorted({d['kind'] for d in docs})))
    if failures:
        print("\n".join(f"FAIL {f}" for f in failures), file=sys.stderr)
        sys.exit(1)
    print("chart OK")


if __name__ == "__main__":
    main()
