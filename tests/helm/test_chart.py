#!/usr/bin/env python3
"""Renders and lints helm/llm-canary with the real Helm library (PyPI helm-python-sdk, Helm v4,
offline) for the default values and every ci/*-values.yaml, and checks what comes out:

- lint has no warning or error;
- every object validates strictly against the Kubernetes schemas (kubernetes-validate), and the
  ServiceMonitor and PrometheusRule against the prometheus-operator CRDs' openAPIV3Schema
  (tests/testdata/crds), with unknown fields rejected;
- the Deployment is hardened and probed, RBAC grants exactly what the daemon uses, every
  dashboard in dashboards/ becomes a labelled ConfigMap with the file's bytes;
- for the default values: the rendered config passes `llm-canary check`, the SLO
  PrometheusRule's spec equals `llm-canary rules --format prometheus-rule` for that config, and
  its groups pass `promtool check rules`.

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


def render(values_file):
    values = helm.values_from_yaml(open(values_file).read()) if values_file else None
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
    allowed = {"dynamographdeployments", "pods", "events", "leases"}
    check(all(res in allowed for (_, _, res) in rules), f"{label}: extra RBAC resources {rules}")


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


def check_rules(docs, binary):
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "config.yaml")
        open(cfg, "w").write(cm["data"]["config.yaml"])
        r = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True)
        check(r.returncode == 0, f"default config fails `llm-canary check`: {r.stdout}{r.stderr}")
        r = subprocess.run([binary, "rules", "--config", cfg, "--format", "prometheus-rule"],
                           capture_output=True, text=True)
        if not check(r.returncode == 0, f"`llm-canary rules` failed: {r.stderr}"):
            return
        generated = yaml.safe_load(r.stdout)
        (rendered,) = [d for d in by_kind(docs, "PrometheusRule")
                       if d["metadata"]["labels"].get("app.kubernetes.io/component") == "slo-rules"]
        check(rendered["spec"] == generated["spec"],
              "rendered SLO PrometheusRule spec differs from `llm-canary rules --format prometheus-rule` for the default config")
        for d in by_kind(docs, "PrometheusRule"):
            path = os.path.join(tmp, d["metadata"]["name"] + ".yaml")
            yaml.safe_dump(d["spec"], open(path, "w"))
            p = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
            check(p.returncode == 0, f"promtool check rules {d['metadata']['name']}: {p.stdout}{p.stderr}")


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
        check_monitoring(docs, values, label)
        if case is None:
            check_rules(docs, a.bin)
        print(f"{label}: {len(docs)} objects: " + ", ".join(sorted({d['kind'] for d in docs})))
    if failures:
        print("\n".join(f"FAIL {f}" for f in failures), file=sys.stderr)
        sys.exit(1)
    print("chart OK")


if __name__ == "__main__":
    main()
