#!/usr/bin/env python3
"""The offline checks of the deployment files: the Helm chart (helm/mcpfleet), the image recipe (deploy/) and the
example manifests rendered from the chart (deploy/kubernetes/).

    check.py offline            every check below; one line per check, then "N passed, M failed"
    check.py render [-f F]... [--set-json PATH=JSON]... [--release R] [--namespace N] [--api-versions V]...
                                the chart's objects as one JSON list on stdout (for the end-to-end tests); the
                                API versions are those `helm template --api-versions` adds to .Capabilities
    check.py promql             every PromQL expression of the rules, the dashboard, the adapter rule and the KEDA
                                trigger, with the metric names each one reads, as JSON (for the end-to-end tests)
    check.py example            rewrites deploy/kubernetes/mcpfleet.yaml from the chart

It runs in the venv tests/run-all.sh makes (.tools/venv-deploy: helm-python-sdk renders and lints with the Helm
SDK, kubernetes-validate holds the Kubernetes schemas) and uses promtool from .tools/prometheus (Debian's
prometheus package, unpacked). The custom resources (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject,
TriggerAuthentication, HTTPRoute) are validated against their CRDs' schemas in tests/deploy/crds/, closed the way the API server's strict
field validation closes them.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import helm_python as helm
import jsonschema
from helm_python import _native
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "mcpfleet"
HERE = ROOT / "tests" / "deploy"
PROMTOOL = Path(os.environ.get("PROMTOOL", ROOT / ".tools" / "prometheus" / "usr" / "bin" / "promtool"))
KUBE_VERSION = "1.31.0"
RELEASE, NAMESPACE = "mcpfleet", "mcp"
# The metrics APIs an adapter serves (prometheus-adapter: deploy/prometheus-adapter-values.yaml). The chart asks
# .Capabilities.APIVersions for them; `helm template` has them only with `--api-versions`.
CUSTOM_METRICS_API = "custom.metrics.k8s.io/v1beta1"
EXTERNAL_METRICS_API = "external.metrics.k8s.io/v1beta1"
METRICS_APIS = (CUSTOM_METRICS_API, EXTERNAL_METRICS_API)
# The values files the chart must render and lint with, besides its defaults.
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Metric names PromQL may read that no replica exports: Prometheus makes `up` itself, and kube-state-metrics
# exports the series of the audit verification CronJob's Jobs.
SYNTHETIC_METRICS = {"up"}
KUBE_STATE_METRICS = {"kube_job_failed", "kube_job_status_start_time"}


def load_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def merge(base: Any, over: Any) -> Any:
    """Helm's coalescing of two values files: maps merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base.get(k), v) if k in base else v
        return out
    return copy.deepcopy(over)


def coalesced(values: dict) -> dict:
    """The values a release renders with: the chart's defaults under `values`, coalesced by Helm (a null removes
    the key)."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.merge_values(values)


def set_path(values: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = values
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def render_files(
    values: dict | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] | list[str] = (),
) -> dict[str, str]:
    """The chart's rendered files, as `helm template --kube-version --api-versions` renders them. Chart.render of
    helm-python-sdk 0.2.2 takes neither; the native call it wraps does (`kube_version` and `api_versions` in its
    options), so it is made directly."""
    opts: dict[str, Any] = {"name": release, "namespace": namespace, "is_install": True, "kube_version": "v" + KUBE_VERSION}
    if api_versions:
        opts["api_versions"] = list(api_versions)
    with helm.Chart.load(str(CHART)) as chart:
        out = _native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts))
    return json.loads(out)


def render(
    values: dict | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] | list[str] = (),
) -> list[dict]:
    """The chart's objects (NOTES.txt left out), hooks included, in a stable order."""
    out = render_files(values, release, namespace, api_versions)
    objects = []
    for path in sorted(out):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(out[path]):
            if doc:
                objects.append(doc)
    return objects


def notes(values: dict | None = None, api_versions: tuple[str, ...] | list[str] = ()) -> str:
    out = render_files(values, api_versions=api_versions)
    return next(v for k, v in out.items() if k.endswith("NOTES.txt"))


# ---------------------------------------------------------------------------------------------------------------
# Strict validation of every rendered object.

CRD_FILES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_v1_podmonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_prometheusrule.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_v1alpha1_triggerauthentication.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_v1_httproute.json",
}


def close_schema(node: Any) -> Any:
    """A CRD schema as the API server applies it with strict field validation: an object schema with properties
    and no x-kubernetes-preserve-unknown-fields refuses unknown fields. Go's `(?i)` inside a pattern becomes
    Python's (at the start)."""
    if isinstance(node, dict):
        node = {k: close_schema(v) for k, v in node.items()}
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        if isinstance(node.get("pattern"), str) and "(?i)" in node["pattern"]:
            node["pattern"] = "(?i)" + node["pattern"].replace("(?i)", "")
        return node
    if isinstance(node, list):
        return [close_schema(v) for v in node]
    return node


_crd_cache: dict[tuple[str, str], dict] = {}


def validate_object(obj: dict) -> str | None:
    """None when `obj` is valid; else why not."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key in CRD_FILES:
        if key not in _crd_cache:
            _crd_cache[key] = close_schema(json.loads((HERE / "crds" / CRD_FILES[key]).read_text()))
        body = {k: v for k, v in obj.items() if k != "metadata"}
        errors = sorted(jsonschema.Draft7Validator(_crd_cache[key]).iter_errors(body), key=lambda e: list(e.path))
        meta = obj.get("metadata", {})
        if not meta.get("name") or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]):
            return f"metadata.name {meta.get('name')!r} is not a DNS subdomain"
        if errors:
            e = errors[0]
            return f"{'.'.join(map(str, e.path))}: {e.message}"
        return None
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'.'.join(map(str, e.path))}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError:
        return f"no schema for {key[0]} {key[1]}: a kind the checks do not know"
    return None


# ---------------------------------------------------------------------------------------------------------------
# What every rendered install must hold, beyond the schemas.


def find(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(o: dict) -> dict:
    """The pod spec of a Deployment, a Job or a CronJob."""
    return (o["spec"]["jobTemplate"]["spec"] if o["kind"] == "CronJob" else o["spec"])["template"]["spec"]


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", pod_spec(o))
        for o in objects
        if o["kind"] in ("Deployment", "Job", "CronJob")
    ]


def flag(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def install_rules(objects: list[dict], values: dict, api_versions: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Problems of one rendered install (empty when none), rendered with these API versions."""
    problems = []
    merged = coalesced(values)
    for where, spec in pod_specs(objects):
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: the pod must run as non-root with a seccomp profile")
        if psc != merged["podSecurityContext"]:
            problems.append(f"{where}: the pod's security context is not podSecurityContext")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: no service account token is mounted")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            restricted = (
                sc.get("allowPrivilegeEscalation") is False
                and sc.get("readOnlyRootFilesystem") is True
                and sc.get("runAsNonRoot") is True
                and sc.get("capabilities", {}).get("drop") == ["ALL"]
                and not sc.get("capabilities", {}).get("add")
            )
            if not restricted or sc.get("privileged"):
                problems.append(f"{where}: container {c['name']} is not restricted")
            if sc != merged["containerSecurityContext"]:
                problems.append(f"{where}: container {c['name']}'s security context is not containerSecurityContext")
            for e in c.get("env", []):
                if re.search(r"URL|PASSWORD|KEY|SECRET|TOKEN", e["name"]) and "value" in e:
                    problems.append(f"{where}: {e['name']} is given inline; secrets come from Secrets")
            if "resources" not in c or "requests" not in c["resources"]:
                problems.append(f"{where}: container {c['name']} has no resource requests")
    for d in find(objects, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        c = spec["containers"][0]
        s = merged["server"]
        grace = s["drainDelaySeconds"] + s["shutdownGraceSeconds"] + s["terminationGraceMarginSeconds"]
        if spec.get("terminationGracePeriodSeconds") != grace:
            problems.append(f"terminationGracePeriodSeconds {spec.get('terminationGracePeriodSeconds')} != {grace}")
        if flag(c["args"], "--drain-delay") != f"{s['drainDelaySeconds']}s":
            problems.append("--drain-delay does not follow server.drainDelaySeconds")
        if flag(c["args"], "--shutdown-grace") != f"{s['shutdownGraceSeconds']}s":
            problems.append("--shutdown-grace does not follow server.shutdownGraceSeconds")
        auto = merged["autoscaling"]["enabled"] or merged["keda"]["enabled"]
        # The replicas count themselves (membership records in Redis): a change of the count restarts no pod.
        if flag(c["args"], "--replicas") is not None:
            problems.append("--replicas is a pod argument: changing the replica count would restart every pod")
        if auto == ("replicas" in d["spec"]):
            problems.append("spec.replicas must be set exactly when no autoscaler owns the count")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/healthz")):
            got = c.get(probe, {}).get("httpGet", {})
            if got.get("path") != path or got.get("port") != "admin":
                problems.append(f"{probe} must be GET {path} on the admin port")
        if flag(c["args"], "--admin-listen") != f"0.0.0.0:{ports['admin']}":
            problems.append("--admin-listen does not match the admin port")
        if flag(c["args"], "--listen") != f"0.0.0.0:{ports['mcp']}":
            problems.append("--listen does not match the mcp port")
        svc = f"{d['metadata']['name']}.{NAMESPACE}.svc"
        if f"{svc}:*" not in (flag(c["args"], "--allowed-hosts") or "").split(","):
            problems.append(f"--allowed-hosts lacks the Service's name {svc}")
        t = merged.get("telemetry", {})
        want_ratio = str(t["traceSampleRatio"]) if t.get("otlpEndpoint") and "traceSampleRatio" in t else None
        got_ratio = flag(c["args"], "--trace-sample-ratio")
        if (got_ratio is None) != (want_ratio is None) or (got_ratio is not None and float(got_ratio) != float(want_ratio)):
            problems.append(f"--trace-sample-ratio is {got_ratio}, not {want_ratio} (passed with otlpEndpoint)")
        want_threads = worker_threads(merged["resources"], s.get("extraArgs", []))
        if flag(c["args"], "--worker-threads") != want_threads:
            problems.append(f"--worker-threads is {flag(c['args'], '--worker-threads')}, not {want_threads}")
        if flag(c["args"], "--max-body-bytes") != str(s["maxBodyBytes"]):
            problems.append("--max-body-bytes does not follow server.maxBodyBytes")
    services = find(objects, "Service")
    admin = [svc for svc in services if "admin" in [p["name"] for p in svc["spec"]["ports"]]]
    if len(admin) != 1:
        problems.append(f"{len(admin)} Services carry the admin port: it must be on one, of its own")
    for svc in admin:
        if svc["spec"].get("type", "ClusterIP") != "ClusterIP" or len(svc["spec"]["ports"]) != 1:
            problems.append(f"Service/{svc['metadata']['name']}: the admin port must be alone on a ClusterIP Service")
    for sm in find(objects, "ServiceMonitor"):
        want = sm["spec"]["selector"]["matchLabels"]
        chosen = [svc for svc in services if want.items() <= svc["metadata"]["labels"].items()]
        if chosen != admin or [e["port"] for e in sm["spec"]["endpoints"]] != ["admin"]:
            problems.append("the ServiceMonitor must select the admin Service alone, on its admin port")
    for pm in find(objects, "PodMonitor"):
        if [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] != ["admin"]:
            problems.append("the PodMonitor must scrape the pods' admin port")
    for np in find(objects, "NetworkPolicy"):
        dns = np["spec"]["egress"][0]
        local = merged["networkPolicy"]["dns"]["nodeLocalAddress"]
        blocks = [peer["ipBlock"]["cidr"] for peer in dns["to"] if "ipBlock" in peer]
        if {p["port"] for p in dns["ports"]} != {53} or blocks != ([f"{local}/{128 if ':' in local else 32}"] if local else []):
            problems.append(f"the NetworkPolicy's first egress rule must be DNS to kube-dns and NodeLocal DNSCache ({local or 'none'})")
        spec = np["spec"]
        np_values = merged["networkPolicy"]
        if spec["ingress"][len(spec["ingress"]) - len(np_values["extraIngress"]):] != np_values["extraIngress"] or (
            np_values["extraEgress"] and spec["egress"][-len(np_values["extraEgress"]):] != np_values["extraEgress"]
        ):
            problems.append("the NetworkPolicy must end with networkPolicy.extraIngress and extraEgress, as given")
    for ing in find(objects, "Ingress"):
        a = ing["metadata"].get("annotations", {})
        if a.get("nginx.ingress.kubernetes.io/proxy-buffering") != "off":
            problems.append("the Ingress must not buffer (SSE)")
        if int(a.get("nginx.ingress.kubernetes.io/proxy-read-timeout", "0")) <= merged["server"]["keepAliveSeconds"]:
            problems.append("the Ingress read timeout must be above the keep-alive")
        if a.get("nginx.ingress.kubernetes.io/proxy-body-size") != str(merged["server"]["maxBodyBytes"]):
            problems.append("the Ingress body size must equal --max-body-bytes")
    ca = merged["database"]["caSecret"]
    for where, spec in pod_specs(objects):
        for c in spec["containers"]:
            if not any(e["name"] == "MCPFLEET_DATABASE_URL" for e in c.get("env", [])):
                continue
            mounts = [(m["name"], m["mountPath"]) for m in c.get("volumeMounts", []) if m["name"] == "database-ca"]
            volumes = [v.get("secret") for v in spec.get("volumes", []) if v["name"] == "database-ca"]
            want = [("database-ca", "/etc/mcpfleet/database-ca")] if ca["existingSecret"] else []
            wanted_volume = [{"secretName": ca["existingSecret"], "items": [{"key": ca["key"], "path": ca["key"]}]}]
            if mounts != want or volumes != (wanted_volume if want else []):
                problems.append(f"{where}: container {c['name']} connects to PostgreSQL: database.caSecret must be mounted at /etc/mcpfleet/database-ca exactly when set")
    problems += downstreams_rules(objects, merged)
    problems += dpop_and_skills_rules(objects, merged)
    for job in find(objects, "Job"):
        if job["metadata"]["labels"].get("app.kubernetes.io/component") == "policy":
            problems += policy_job_rules(job, objects, merged)
            continue
        m, pod = merged["database"]["migrate"], job["spec"]["template"]
        placed = {k: pod["spec"].get(k, v.__class__()) for k, v in (("nodeSelector", {}), ("tolerations", []), ("affinity", {}))}
        if placed != {k: m[k] for k in placed} or pod["metadata"].get("annotations", {}) != m["podAnnotations"]:
            problems.append("the migration Job's pod must carry database.migrate's nodeSelector, tolerations, affinity and podAnnotations")
        hooks = job["metadata"].get("annotations", {}).get("helm.sh/hook", "")
        if set(hooks.split(",")) != {"pre-install", "pre-upgrade"}:
            problems.append("the migration Job must be a pre-install,pre-upgrade hook")
        if job["spec"]["template"]["spec"]["containers"][0]["args"][0] != "migrate":
            problems.append("the migration Job must run `mcpfleet migrate`")
    for cj in find(objects, "CronJob"):
        a, spec = merged["database"]["auditVerify"], cj["spec"]
        job = spec["jobTemplate"]["spec"]
        if pod_spec(cj)["containers"][0]["args"][:2] != ["audit", "verify"] or spec["concurrencyPolicy"] != "Forbid":
            problems.append("the audit CronJob must run `mcpfleet audit verify`, one at a time")
        if len(cj["metadata"]["name"]) > 52 or spec["schedule"] != a["schedule"] or job["backoffLimit"] != a["backoffLimit"]:
            problems.append("the audit CronJob's name must fit 52 characters, its schedule and retries follow database.auditVerify")
        if not spec.get("failedJobsHistoryLimit") or "ttlSecondsAfterFinished" in job:
            problems.append("the audit CronJob must keep its failed Job, which the alert reads")
    for rule in find(objects, "PrometheusRule"):
        anchors = runbook_anchors()
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                if "alert" not in r:
                    continue
                url = r.get("annotations", {}).get("runbook_url", "")
                anchor = url.split("#", 1)[1] if "#" in url else ""
                if anchor not in anchors:
                    problems.append(f"alert {r['alert']}: runbook_url {url!r} names no heading of docs/RUNBOOKS.md")
    auths = {a["metadata"]["name"]: a["spec"] for a in find(objects, "TriggerAuthentication")}
    r = merged["redis"]
    want_auth: dict = {}
    if r["username"]:
        want_auth["env"] = [{"parameter": "username", "name": "MCPFLEET_REDIS_USERNAME", "containerName": "mcpfleet"}]
    refs = [{"parameter": p, "name": ref["existingSecret"], "key": ref["key"]}
            for p, ref in (("password", r["passwordSecret"]), ("ca", r["caSecret"])) if ref["existingSecret"]]
    if refs:
        want_auth["secretTargetRef"] = refs
    for so in find(objects, "ScaledObject"):
        for t in so["spec"]["triggers"]:
            if not t["type"].startswith("redis"):
                continue
            ref = t.get("authenticationRef", {}).get("name")
            if "passwordFromEnv" in t["metadata"] or auths.get(ref, {}) != want_auth or (ref is None) != (not want_auth):
                problems.append(f"the {t['type']} trigger must authenticate through a TriggerAuthentication carrying {want_auth or 'nothing'}")
    for d in find(objects, "Deployment"):
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        if r["username"] and env.get("MCPFLEET_REDIS_USERNAME", {}).get("value") != r["username"]:
            problems.append("the Redis ACL user must be in MCPFLEET_REDIS_USERNAME, where KEDA reads it too")
    for hpa in find(objects, "HorizontalPodAutoscaler"):
        want = hpa_metrics(merged, api_versions)
        if hpa_metric_names(hpa) != want:
            problems.append(f"the HPA scales on {hpa_metric_names(hpa)}, not {want}")
        if hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] < 60:
            problems.append("the HPA must stabilise its scale-down")
    return problems


def downstreams_rules(objects: list[dict], merged: dict) -> list[str]:
    """The downstreams (docs/DOWNSTREAM.md): the document in a ConfigMap, mounted and passed as --downstreams, with a
    checksum that rolls the pods; its secrets' variables from their Secrets; URL mode's key ring from its Secret, and
    the pages /downstream/ routed by the Ingress and the HTTPRoute exactly when URL mode is on."""
    problems = []
    d = merged["downstreams"]
    deployment = find(objects, "Deployment")[0]
    pod = deployment["spec"]["template"]
    c = pod["spec"]["containers"][0]
    maps = [m for m in find(objects, "ConfigMap") if m["metadata"]["name"].endswith("-downstreams")]
    mounted = any(m["name"] == "downstreams" and m["mountPath"] == "/etc/mcpfleet/downstreams" for m in c.get("volumeMounts", []))
    if d["document"]:
        if len(maps) != 1 or maps[0]["data"].get("downstreams.yaml", "").strip() != d["document"].strip():
            problems.append("the downstreams ConfigMap must hold downstreams.document as downstreams.yaml")
        if "--downstreams=/etc/mcpfleet/downstreams/downstreams.yaml" not in c["args"] or not mounted:
            problems.append("the server must mount the downstreams ConfigMap and read it with --downstreams")
        if "checksum/downstreams" not in pod["metadata"].get("annotations", {}):
            problems.append("a new downstreams document must roll the pods (checksum/downstreams)")
    elif maps or mounted or any(a.startswith("--downstreams") for a in c["args"]):
        problems.append("without downstreams.document, no ConfigMap, mount or --downstreams")
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c.get("env", [])}
    for s in d["secretEnv"]:
        if env.get(s["name"]) != {"name": s["secretName"], "key": s["key"]}:
            problems.append(f"{s['name']} must come from Secret {s['secretName']}, key {s['key']}")
    key = d["keySecret"]
    want = {"name": key["existingSecret"], "key": key["key"]} if key["existingSecret"] else None
    if env.get("MCPFLEET_DOWNSTREAM_KEYS") != want:
        problems.append("MCPFLEET_DOWNSTREAM_KEYS must come from downstreams.keySecret exactly when it is set")
    for ing in find(objects, "Ingress"):
        paths = [p["path"] for r in ing["spec"]["rules"] for p in r["http"]["paths"]]
        if ("/downstream/" in paths) != bool(want):
            problems.append("the Ingress must route /downstream/ exactly when URL mode is on (downstreams.keySecret)")
    for route in find(objects, "HTTPRoute"):
        values = [m["path"]["value"] for r in route["spec"]["rules"] for m in r["matches"]]
        if ("/downstream/" in values) != bool(want):
            problems.append("the HTTPRoute must route /downstream/ exactly when URL mode is on (downstreams.keySecret)")
    return problems


def dpop_and_skills_rules(objects: list[dict], merged: dict) -> list[str]:
    """DPoP (docs/IDENTITY.md#dpop) and skills (docs/SKILLS.md): auth.dpop's flags exactly when its mode is not off,
    the nonce keys from their Secret (never inline) exactly when one is named; skills.dir, its page size and its
    digest as flags exactly when a directory is set."""
    problems = []
    c = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c.get("env", [])}
    d = merged["auth"]["dpop"]
    on = d["mode"] != "off"
    want = [f"--dpop={d['mode']}", f"--dpop-max-age={d['maxAge']}"] if on else []
    if [a for a in args if a.startswith("--dpop=") or a.startswith("--dpop-max-age=")] != want:
        problems.append("--dpop and --dpop-max-age must follow auth.dpop, and be absent when its mode is off")
    secret = d["nonceKeySecret"]
    nonce = {"name": secret["existingSecret"], "key": secret["key"]} if on and secret["existingSecret"] else None
    if env.get("MCPFLEET_DPOP_NONCE_KEYS") != nonce:
        problems.append("MCPFLEET_DPOP_NONCE_KEYS must come from auth.dpop.nonceKeySecret exactly when it is set")
    if (f"--dpop-nonce-period={d['noncePeriod']}" in args) != bool(nonce):
        problems.append("--dpop-nonce-period must be passed exactly with the nonce keys")
    s = merged["skills"]
    want = []
    if s["dir"]:
        want = [f"--skills={s['dir']}", f"--skills-page-size={s['pageSize']}"]
        want += [f"--skills-digest={s['digest']}"] if s["digest"] else []
    if [a for a in args if a.startswith("--skills")] != want:
        problems.append("--skills, --skills-page-size and --skills-digest must follow skills, and be absent without skills.dir")
    return problems


def policy_job_rules(job: dict, objects: list[dict], merged: dict) -> list[str]:
    """The policy hook Job (docs/POLICY.md): after install and upgrade, `policy apply` of the ConfigMap's document
    (exactly policy.document), with the replicas' Redis flags and credentials, placed as policy.applyJob says."""
    problems = []
    p = merged["policy"]
    pod = job["spec"]["template"]
    c = pod["spec"]["containers"][0]
    hooks = job["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    if set(hooks.split(",")) != {"post-install", "post-upgrade"}:
        problems.append("the policy Job must be a post-install,post-upgrade hook")
    if c["args"][:3] != ["policy", "apply", "/etc/mcpfleet/policy/policy.yaml"] or flag(c["args"], "--by") != p["by"]:
        problems.append("the policy Job must run `mcpfleet policy apply` of its mounted document, --by policy.by")
    maps = [m for m in find(objects, "ConfigMap") if m["metadata"]["name"].endswith("-policy")]
    if len(maps) != 1 or maps[0]["data"].get("policy.yaml", "").strip() != p["document"].strip():
        problems.append("the policy ConfigMap must hold policy.document as policy.yaml")
    server = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    redis_args = lambda args: [a for a in args if a.startswith("--redis-")]
    redis_env = lambda env: [e for e in env if e["name"].startswith("MCPFLEET_REDIS_")]
    if redis_args(c["args"]) != redis_args(server["args"]) or redis_env(c.get("env", [])) != redis_env(server.get("env", [])):
        problems.append("the policy Job must reach Redis as the replicas do (the same --redis-* flags and credentials)")
    j = p["applyJob"]
    placed = {k: pod["spec"].get(k, v.__class__()) for k, v in (("nodeSelector", {}), ("tolerations", []), ("affinity", {}))}
    annotations = {k: v for k, v in pod["metadata"].get("annotations", {}).items() if k != "mcpfleet.io/policy-sha256"}
    if placed != {k: j[k] for k in placed} or annotations != j["podAnnotations"]:
        problems.append("the policy Job's pod must carry policy.applyJob's nodeSelector, tolerations, affinity and podAnnotations")
    return problems


def cores(quantity: str | float) -> float:
    """A Kubernetes CPU quantity (500m, 2, 1.5) in cores."""
    q = str(quantity)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def worker_threads(resources: dict, extra_args: list[str]) -> str | None:
    """--worker-threads as the chart must render it: the CPU request rounded up (1 to 256) when there is no CPU
    limit (with one, the runtime follows the cgroup's quota by itself) and server.extraArgs does not give it."""
    req, lim = resources.get("requests", {}).get("cpu"), resources.get("limits", {}).get("cpu")
    if req is None or lim is not None or any(a.split("=")[0] == "--worker-threads" for a in extra_args):
        return None
    return str(max(1, min(256, math.ceil(round(cores(req), 3)))))


def check_worker_threads() -> None:
    """--worker-threads follows the CPU request in each of its forms, and only without a CPU limit."""
    cases = [
        ({"requests": {"cpu": "500m"}}, "1"), ({"requests": {"cpu": "2"}}, "2"), ({"requests": {"cpu": "1.5"}}, "2"),
        ({"requests": {"cpu": 1.5}}, "2"), ({"requests": {"cpu": 3}}, "3"), ({"requests": {"cpu": "2500m"}}, "3"),
        ({"requests": {"cpu": "2000m"}}, "2"), ({"requests": {"cpu": "1m"}}, "1"), ({"requests": {"cpu": "0.1"}}, "1"),
        ({"requests": {"cpu": "300"}}, "256"), ({"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}, None),
        ({"requests": {"cpu": None}}, None),
    ]
    base = load_yaml(CHART / "ci" / "minimal-values.yaml")
    for resources, want in cases:
        values = merge(base, {"resources": resources})
        (d,) = find(render(values), "Deployment")
        got = flag(d["spec"]["template"]["spec"]["containers"][0]["args"], "--worker-threads")
        if got != want or worker_threads(resources, []) != want:
            raise AssertionError(f"resources {resources}: --worker-threads={got}, want {want}")
    given = merge(base, {"server": {"extraArgs": ["--worker-threads=6"]}})
    (d,) = find(render(given), "Deployment")
    if [a for a in d["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--worker-threads")] != ["--worker-threads=6"]:
        raise AssertionError("--worker-threads in server.extraArgs must be the only one")


def hpa_metric_names(hpa: dict) -> list[str]:
    """The HPA's metrics, as `cpu`, `pods:<name>` or `external:<name>`."""
    out = []
    for m in hpa["spec"]["metrics"]:
        t = m["type"]
        out.append(m["resource"]["name"] if t == "Resource" else f"{t.lower()}:{m[t.lower()]['metric']['name']}")
    return out


def hpa_metrics(merged: dict, api_versions: tuple[str, ...] | list[str]) -> list[str]:
    """What the HPA must scale on: CPU always; the per-pod in-flight metric and the task demand only where a
    metrics API serves them, since an HPA with a metric it cannot fetch never scales down."""
    a = merged["autoscaling"]
    want = ["cpu"]
    if a["inFlightPerPod"] and CUSTOM_METRICS_API in api_versions:
        want.append("pods:mcp_tool_calls_in_flight")
    if a["taskDemand"]["enabled"] and EXTERNAL_METRICS_API in api_versions:
        want.append("external:mcp_task_demand")
    return want


def runbook_anchors() -> set[str]:
    text = (ROOT / "docs" / "RUNBOOKS.md").read_text(encoding="utf-8")
    anchors = set()
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            title = m.group(1).strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


# ---------------------------------------------------------------------------------------------------------------
# PromQL: the rules, the dashboard, the adapter rule and the KEDA trigger.

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "atan2", "start", "end",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads. Strings, label matchers, ranges and the label lists of by,
    without, on, ignoring, group_left and group_right are cut first; then every identifier not followed by `(`
    (a function or an aggregation) and not a keyword is a metric."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^{}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word in PROMQL_WORDS or re.fullmatch(r"\d", word[0]):
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    out = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"dashboard panel {p.get('title')!r}", t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q or "")
        if m:
            out.append((f"dashboard variable {v['name']}", m.group(1)))
    return out


def grafana_to_promql(expr: str) -> str:
    for var, value in (("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1h"),
                       ("$namespace", NAMESPACE), ("$job", RELEASE), ("$tool", ".*")):
        expr = expr.replace(var, value)
    return expr


def adapter_exprs() -> list[tuple[str, str]]:
    """The prometheus-adapter rule of deploy/prometheus-adapter-values.yaml, with its template fields filled as
    the adapter fills them."""
    doc = load_yaml(ROOT / "deploy" / "prometheus-adapter-values.yaml")
    out = []
    rules = doc["rules"]
    for r in rules.get("custom", []) + rules.get("external", []):
        out.append(("adapter seriesQuery", r["seriesQuery"]))
        q = r["metricsQuery"]
        q = q.replace("<<.Series>>", "mcp_tool_calls_in_flight").replace("<<.LabelMatchers>>", 'namespace="mcp"')
        q = q.replace("<<.GroupBy>>", "pod")
        out.append((f"adapter metricsQuery {r['name'].get('as', '')}", q))
    return out


def rendered_rules(values: dict) -> dict:
    rule = find(render(values), "PrometheusRule")
    assert rule, "the rules values render no PrometheusRule"
    return {"groups": rule[0]["spec"]["groups"]}


def all_exprs() -> list[dict]:
    """Every PromQL expression the deployment ships, and the metric names each reads."""
    prod = load_yaml(CHART / "ci" / "production-values.yaml")
    keda = load_yaml(CHART / "ci" / "keda-values.yaml")
    exprs: list[tuple[str, str]] = []
    recorded = set()
    for g in rendered_rules(prod)["groups"]:
        for r in g["rules"]:
            name = r.get("record") or r.get("alert")
            exprs.append((f"rule {name}", r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    exprs += [(w, grafana_to_promql(e)) for w, e in dashboard_exprs()]
    exprs += adapter_exprs()
    for so in find(render(keda), "ScaledObject"):
        for t in so["spec"]["triggers"]:
            if t["type"] == "prometheus":
                exprs.append(("keda trigger", t["metadata"]["query"]))
    return [
        {
            "where": w,
            "expr": e,
            "reads": sorted(metric_names(e)),
            "metrics": sorted(metric_names(e) - recorded - SYNTHETIC_METRICS - KUBE_STATE_METRICS),
        }
        for w, e in exprs
    ]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, check=False)


# ---------------------------------------------------------------------------------------------------------------
# The checks.


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001: every failure is reported, and the run goes on
            self.failed += 1
            print(f"FAIL {name}: {e}")
        else:
            self.passed += 1
            print(f"ok   {name}")


def values_sets() -> list[tuple[str, dict]]:
    return [("default values", {})] + [(str(p.relative_to(ROOT)), load_yaml(p)) for p in CI_VALUES]


def check_lint(values: dict) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v" + KUBE_VERSION)
    bad = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
    if bad:
        raise AssertionError("; ".join(m["error"] for m in bad))


def check_render(values: dict) -> None:
    """Rendered for a cluster with the metrics APIs (so that every metric of the HPA is validated too)."""
    objects = render(values, api_versions=METRICS_APIS)
    failures = []
    for o in objects:
        why = validate_object(o)
        if why:
            failures.append(f"{o['kind']}/{o['metadata'].get('name')}: {why}")
    failures += install_rules(objects, values, METRICS_APIS)
    if failures:
        raise AssertionError("; ".join(failures))


def check_hpa_follows_the_metrics_apis() -> None:
    """Without a metrics adapter the HPA scales on CPU alone (an HPA whose Pods or External metric cannot be fetched
    never scales down), with one it adds the metrics that API serves; NOTES.txt says which."""
    values = load_yaml(CHART / "ci" / "production-values.yaml")
    merged = coalesced(values)
    for apis in ((), (CUSTOM_METRICS_API,), (EXTERNAL_METRICS_API,), METRICS_APIS):
        (hpa,) = find(render(values, api_versions=apis), "HorizontalPodAutoscaler")
        got, want = hpa_metric_names(hpa), hpa_metrics(merged, apis)
        if got != want:
            raise AssertionError(f"with {list(apis) or 'no metrics API'}: {got}, not {want}")
        text = notes(values, apis)
        for api, metric in ((CUSTOM_METRICS_API, "mcp_tool_calls_in_flight"), (EXTERNAL_METRICS_API, "mcp_task_demand")):
            said = f"no {api.split('/')[0]} API" in text
            if said == (api in apis):
                raise AssertionError(f"with {list(apis) or 'no metrics API'}: NOTES.txt must say when {metric} is left out, and only then")
    if want != ["cpu", "pods:mcp_tool_calls_in_flight", "external:mcp_task_demand"]:
        raise AssertionError(f"the production values must scale on all three metrics with both APIs, not {want}")


def check_bad_values(path: Path) -> None:
    """The file's first line says `# expect: <text>`: rendering with it must fail with that text."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    m = re.fullmatch(r"# expect: (.+)", first)
    assert m, f"{path.name}: the first line must be `# expect: <message>`"
    try:
        render(load_yaml(path))
    except helm.HelmError as e:
        if m.group(1) not in str(e):
            raise AssertionError(f"failed, but with {str(e).strip()!r}, not {m.group(1)!r}") from None
        return
    raise AssertionError("rendered: the chart accepted it")


def check_rules() -> None:
    with tempfile.TemporaryDirectory() as d:
        rules = rendered_rules(load_yaml(HERE / "rules-values.yaml"))
        Path(d, "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        shutil.copy(HERE / "rules-test.yaml", Path(d, "rules-test.yaml"))
        r = promtool("check", "rules", "rules.yaml", cwd=Path(d))
        if r.returncode != 0:
            raise AssertionError(r.stdout + r.stderr)
        r = promtool("test", "rules", "rules-test.yaml", cwd=Path(d))
        if r.returncode != 0:
            raise AssertionError(r.stdout + r.stderr)


def check_every_alert_is_tested() -> None:
    rules = rendered_rules(load_yaml(HERE / "rules-values.yaml"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = load_yaml(HERE / "rules-test.yaml")["tests"]
    fired, silent = set(), set()
    for t in tests:
        for a in t.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else silent).add(a["alertname"])
    missing = sorted((alerts - fired) | (alerts - silent))
    if missing:
        raise AssertionError(f"alerts without a firing and a silent test: {', '.join(missing)}")


def check_alert_settings() -> None:
    """metrics.prometheusRule.alerts names every alert of the rule, in values.yaml and in the schema; `enabled:
    false` leaves an alert out (and the group, when it was the last), `additionalLabels` add to its labels."""
    base = load_yaml(HERE / "rules-values.yaml")
    rendered = [r["alert"] for g in rendered_rules(base)["groups"] for r in g["rules"] if "alert" in r]
    defaults = list(load_yaml(CHART / "values.yaml")["metrics"]["prometheusRule"]["alerts"])
    schema = json.loads((CHART / "values.schema.json").read_text())
    in_schema = list(schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["alerts"]["properties"])
    if not rendered == defaults == in_schema:
        raise AssertionError(f"the rule's alerts {rendered}, values.yaml's {defaults} and the schema's {in_schema} differ")
    settings = {"McpfleetDown": {"enabled": False}, "McpfleetRedisSlow": {"additionalLabels": {"severity": "page", "team": "db"}}}
    rules = {r["alert"]: r for g in rendered_rules(merge(base, {"metrics": {"prometheusRule": {"alerts": settings}}}))["groups"]
             for r in g["rules"] if "alert" in r}
    if "McpfleetDown" in rules or rules["McpfleetRedisSlow"]["labels"] != {"severity": "page", "team": "db"}:
        raise AssertionError("enabled: false must leave the alert out, additionalLabels add over its labels")
    off = {name: {"enabled": False} for name in rendered}
    groups = rendered_rules(merge(base, {"metrics": {"prometheusRule": {"alerts": off}}}))["groups"]
    if [g["name"] for g in groups] != ["mcpfleet.rules"]:
        raise AssertionError("with every alert off, only the recording rules are left")


def check_promql_parses() -> None:
    exprs = all_exprs()
    doc = {"groups": [{"name": "all", "rules": [{"record": f"check:expr{i}", "expr": x["expr"]}
                                                for i, x in enumerate(exprs)]}]}
    with tempfile.TemporaryDirectory() as d:
        Path(d, "exprs.yaml").write_text(yaml.safe_dump(doc))
        r = promtool("check", "rules", "exprs.yaml", cwd=Path(d))
        if r.returncode != 0:
            raise AssertionError(r.stdout + r.stderr)
    empty = [x["expr"] for x in exprs if not x["reads"]]
    if empty:
        raise AssertionError(f"an expression reads no series: {empty[0]}")


def check_metric_name_parser() -> None:
    cases = {
        'sum by (tool) (rate(mcp_a_total{job="x",tool=~"a|b"}[5m])) / on(job) group_left(pod) mcp_b': {"mcp_a_total", "mcp_b"},
        "histogram_quantile(0.95, sum by (le) (rate(mcp_c_bucket[$__rate_interval])))".replace("$__rate_interval", "5m"): {"mcp_c_bucket"},
        "absent(up{job=\"x\"} == 1) or vector(0) > bool 2": {"up"},
        "time() - mcp_ts > 600 unless mcp_d offset 5m": {"mcp_ts", "mcp_d"},
    }
    for expr, want in cases.items():
        got = metric_names(expr)
        if got != want:
            raise AssertionError(f"{expr}: {sorted(got)} != {sorted(want)}")


def check_example_is_current() -> None:
    want = example_manifest()
    have = (ROOT / "deploy" / "kubernetes" / "mcpfleet.yaml").read_text(encoding="utf-8")
    if want != have:
        raise AssertionError("deploy/kubernetes/mcpfleet.yaml is not the chart's rendering: run `check.py example`")


def example_manifest() -> str:
    values = load_yaml(ROOT / "deploy" / "kubernetes" / "values.yaml")
    objects = render(values, namespace="mcpfleet")
    head = (
        "# Rendered from helm/mcpfleet with deploy/kubernetes/values.yaml by `tests/deploy/check.py example`:\n"
        "# do not edit; change the chart or the values and render again (the checks fail while it differs).\n"
    )
    return head + "".join("---\n" + yaml.safe_dump(o, sort_keys=False) for o in objects)


def check_dockerfile() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    toolchain = re.search(r'channel = "([^"]+)"', (ROOT / "rust-toolchain.toml").read_text()).group(1)
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    problems = []
    if not any(f.startswith(f"docker.io/library/rust:{toolchain}-") for f in froms):
        problems.append(f"the build stage must pin rust:{toolchain} (rust-toolchain.toml)")
    if "--locked" not in text or "--release" not in text:
        problems.append("the build must be `cargo build --release --locked`")
    if not re.search(r"^FROM\s+\S*distroless/cc\S*nonroot", text, re.M):
        problems.append("the runtime stage must be distroless (no shell) and non-root")
    if not re.search(r"^USER\s+65532:65532", text, re.M):
        problems.append("the runtime user must be 65532:65532 (the chart's runAsUser)")
    defaults = load_yaml(CHART / "values.yaml")["server"]["ports"]
    expose = set(re.findall(r"^EXPOSE\s+(.+)$", text, re.M)[0].split()) if "EXPOSE" in text else set()
    if expose != {str(defaults["mcp"]), str(defaults["admin"])}:
        problems.append(f"EXPOSE {sorted(expose)} must be the chart's ports {defaults}")
    if 'ENTRYPOINT ["/usr/local/bin/mcpfleet"]' not in text:
        problems.append("the entrypoint must be /usr/local/bin/mcpfleet (the chart's command)")
    if problems:
        raise AssertionError("; ".join(problems))
    check_build_context(text)


# What the image recipe builds by default (its ARGs), and a tool writer's crate it must build the same way.
DOCKER_BUILDS = (
    {"CRATE": ".", "PACKAGE": "mcpfleet", "BIN": ""},
    {"CRATE": "examples/greet", "PACKAGE": "greet", "BIN": ""},
)


def check_build_context(dockerfile: str) -> None:
    """The build stage's COPY sources, alone in a directory (and none of them in .dockerignore), hold each build of
    DOCKER_BUILDS: the ARGs' defaults are the first, and for each, `--manifest-path <CRATE>/Cargo.toml` loads with
    cargo, has the package and its binary and a Cargo.lock (for --locked), and every path dependency is in the
    context."""
    build = dockerfile.split("\nFROM ", 2)[1]
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S*)\s*$", build, re.M))
    if args != DOCKER_BUILDS[0]:
        raise AssertionError(f"the build stage's ARGs are {args}, not {DOCKER_BUILDS[0]}")
    run = re.sub(r"\\\n\s*", " ", build[build.index("RUN "):])
    for want in ('cargo build --release --locked', '--manifest-path "$CRATE/Cargo.toml"', '-p "$PACKAGE"',
                 'bin="${BIN:-$PACKAGE}"', '--bin "$bin"', 'install -D -m 0755 "/src/target/release/$bin" /out/mcpfleet'):
        if want not in run:
            raise AssertionError(f"the build must run {want!r}")
    sources = []
    for line in build.splitlines():
        m = re.match(r"COPY\s+(?!--from)(.+)\s+\S+$", line)
        if m:
            sources += m.group(1).split()
    patterns = [l.strip().rstrip("/") for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    ignored = [p for p in patterns if not p.startswith("!")]
    kept = [p[1:] for p in patterns if p.startswith("!")]
    left_out = [s for s in sources if s.rstrip("/") not in kept
                and any(s.rstrip("/") == i or s.startswith(i + "/") for i in ignored)]
    if left_out:
        raise AssertionError(f"the Dockerfile copies what .dockerignore leaves out: {left_out} vs {patterns}")
    with tempfile.TemporaryDirectory() as d:
        for src in sources:
            path = ROOT / src
            if path.is_dir():
                shutil.copytree(path, Path(d, src), ignore=shutil.ignore_patterns("target"))
            else:
                Path(d, src).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(d, src))
        for b in DOCKER_BUILDS:
            crate, package, binary = Path(d, b["CRATE"]), b["PACKAGE"], b["BIN"] or b["PACKAGE"]
            if not (crate / "Cargo.lock").is_file():
                raise AssertionError(f"{b['CRATE']}/Cargo.lock is not in the build context: --locked needs it")
            r = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--manifest-path",
                                str(crate / "Cargo.toml")], cwd=d, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise AssertionError(f"{b['CRATE']} in the build context is not a crate cargo can load: {r.stderr.strip()}")
            packages = {p["name"]: p for p in json.loads(r.stdout)["packages"]}
            if package not in packages:
                raise AssertionError(f"{b['CRATE']} in the build context has no package {package}")
            bins = [t["name"] for t in packages[package]["targets"] if "bin" in t["kind"]]
            if binary not in bins:
                raise AssertionError(f"package {package} has no binary {binary} (it has {bins})")
            for dep in packages[package]["dependencies"]:
                if dep.get("path") and not (Path(dep["path"]).resolve().is_relative_to(Path(d).resolve())
                                            and Path(dep["path"], "Cargo.toml").is_file()):
                    raise AssertionError(f"{package}'s path dependency {dep['name']} is not in the build context")
        # What the sources embed (the migrations, Lua scripts, cases) must be in the context too.
        for rs in (f for f in Path(d, "crates").rglob("*.rs") if "src" in f.relative_to(d).parts):
            # Up to the unit tests, which the release build leaves out.
            code = rs.read_text(encoding="utf-8").split("#[cfg(test)]", 1)[0]
            for m in re.finditer(r'include_(?:str|bytes)!\("([^"]+)"\)', code):
                if not (rs.parent / m.group(1)).exists():
                    raise AssertionError(f"{rs.relative_to(d)} embeds {m.group(1)}, which the build context lacks")


def check_notes() -> None:
    text = notes(load_yaml(CHART / "ci" / "production-values.yaml"))
    for want in ("rollout status deployment/mcpfleet", "port-forward service/mcpfleet", "drains for up to 50 s",
                 "?sslmode=verify-full&sslrootcert=/etc/mcpfleet/database-ca/ca.crt"):
        if want not in text:
            raise AssertionError(f"NOTES.txt lacks {want!r}")
    if "WARNING" not in notes({}):
        raise AssertionError("NOTES.txt must warn while the issuer is example.com")
    if "WARNING" in text:
        raise AssertionError("NOTES.txt warns about the production values")
    # A tool timeout longer than the shutdown grace is warned about (the defaults, the server's, are); one within
    # it is not.
    for server, warned in (({}, True), ({"toolTimeoutSeconds": 25}, False), ({"toolTimeoutSeconds": 30, "shutdownGraceSeconds": 30}, False),
                           ({"toolTimeoutSeconds": 31, "drainDelaySeconds": 10, "shutdownGraceSeconds": 30}, True)):
        values = merge(load_yaml(CHART / "ci" / "minimal-values.yaml"), {"server": server})
        if ("longer than a drain lets it finish" in notes(values)) != warned:
            raise AssertionError(f"NOTES.txt {'does not warn' if warned else 'warns'} about a tool timeout with server {server or 'defaults'}")
    # A readiness window shorter than the redis.mode's default failover is warned about; the default is not.
    minimal = load_yaml(CHART / "ci" / "minimal-values.yaml")
    sentinel = merge(minimal, {"redis": {"mode": "sentinel", "nodes": ["s-0:26379"], "sentinelMaster": "m"}})
    cluster = merge(minimal, {"redis": {"mode": "cluster", "nodes": ["r-0:6379"]}})
    short = {"probes": {"readiness": {"periodSeconds": 5, "failureThreshold": 5}}}
    for values, warned in ((sentinel, False), (cluster, False), (merge(sentinel, short), True), (merge(cluster, short), False)):
        if ("before a Redis" in notes(values)) != warned:
            raise AssertionError(f"NOTES.txt {'does not warn' if warned else 'warns'} about a readiness window of {values.get('probes', 'the defaults')} with redis.mode {values['redis']['mode']}")


def offline() -> int:
    c = Checks()
    c.check("metric names are read out of PromQL correctly", check_metric_name_parser)
    for name, values in values_sets():
        c.check(f"lint ({name})", lambda v=values: check_lint(v))
        c.check(f"render and validate every object strictly ({name})", lambda v=values: check_render(v))
    for path in sorted((HERE / "bad-values").glob("*.yaml")):
        c.check(f"refuse bad values {path.name}", lambda p=path: check_bad_values(p))
    c.check("the HPA scales on CPU alone without a metrics API, and on what each API serves", check_hpa_follows_the_metrics_apis)
    c.check("--worker-threads is the CPU request rounded up, without a CPU limit", check_worker_threads)
    c.check("promtool check rules + test rules", check_rules)
    c.check("every alert has a firing and a silent test", check_every_alert_is_tested)
    c.check("each alert can be turned off and given labels", check_alert_settings)
    c.check("every PromQL expression parses (rules, dashboard, adapter, KEDA)", check_promql_parses)
    c.check("deploy/kubernetes/mcpfleet.yaml is the chart's rendering", check_example_is_current)
    c.check("deploy/Dockerfile", check_dockerfile)
    c.check("NOTES.txt", check_notes)
    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("offline")
    r = sub.add_parser("render")
    r.add_argument("-f", "--values", action="append", default=[], help="a values file; later ones win")
    r.add_argument("--set-json", action="append", default=[], help="PATH=JSON, e.g. auth.issuer='\"http://x\"'")
    r.add_argument("--release", default=RELEASE)
    r.add_argument("--namespace", default=NAMESPACE)
    r.add_argument("--api-versions", action="append", default=[],
                   help="an API version the cluster serves, as `helm template --api-versions` (repeat, or comma-separate)")
    sub.add_parser("promql")
    sub.add_parser("example")
    a = p.parse_args()
    if a.cmd == "offline":
        return offline()
    if a.cmd == "render":
        values: dict = {}
        for f in a.values:
            values = merge(values, load_yaml(Path(f)))
        for s in a.set_json:
            path, _, raw = s.partition("=")
            set_path(values, path, json.loads(raw))
        apis = [v for arg in a.api_versions for v in arg.split(",") if v]
        json.dump(render(values, a.release, a.namespace, apis), sys.stdout)
        return 0
    if a.cmd == "promql":
        json.dump(all_exprs(), sys.stdout, indent=1)
        return 0
    if a.cmd == "example":
        (ROOT / "deploy" / "kubernetes" / "mcpfleet.yaml").write_text(example_manifest(), encoding="utf-8")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
