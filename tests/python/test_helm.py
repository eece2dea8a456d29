"""The Helm chart in deploy/helm/sluice, rendered and linted by Helm itself (Helm v4's Go code, from PyPI
`helm-python-sdk`, offline), and its manifests checked against what they deploy.

What is checked against the real thing: Helm's lint; every rendered manifest against the Kubernetes 1.30 schemas
(`kubernetes-validate`, strict) and the ServiceMonitor against the fields of the Prometheus Operator's CRD it uses;
the values schema refusing bad values by name; the rendered rules with `sluice check`; the rendered container's
arguments and environment (its Secret resolved) running a real sluice on a real Redis; and an edited rules
ConfigMap, swapped in the way the kubelet swaps it, reloaded by a running sluice without a restart.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import redis_server, running_sluice, wait_until
from helm_python import chart
from helm_python.errors import HelmRenderError, HelmValuesError

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "sluice"
KUBERNETES_VERSION = "1.30.0"
RELEASE, NAMESPACE = "rl", "limits"

# Every optional object on.
FULL: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"repository": "registry.example.com/sluice", "tag": "0.1.0", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "redis": {"url": "redis://redis.limits.svc:6379"},
    "adminToken": {"value": "a-token-of-sixteen"},
    "extraArgs": ["--response-headers", "draft"],
    "extraEnv": [{"name": "SLUICE_FAILURE_POLICY", "value": "fail_open"}],
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6, "targetMemoryUtilizationPercentage": 80},
    "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"}},
    "networkPolicy": {
        "enabled": True,
        "grpcFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}],
        "httpFrom": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "egress": [{"ports": [{"port": 6379, "protocol": "TCP"}]}],
    },
    "podAnnotations": {"example.com/team": "edge"},
    "podLabels": {"example.com/tier": "platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "edge", "effect": "NoSchedule"}],
    "priorityClassName": "system-cluster-critical",
    "service": {"annotations": {"example.com/owner": "edge"}},
}

# The fields of monitoring.coreos.com/v1 ServiceMonitor that the chart writes, as the Prometheus Operator's CRD
# declares them (a Duration is its pattern), closed so that a misspelt field fails.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
SERVICE_MONITOR_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "namespaceSelector": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
        },
        "endpoints": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "port": {"type": "string"},
                    "path": {"type": "string"},
                    "interval": {"type": "string", "pattern": DURATION},
                    "scrapeTimeout": {"type": "string", "pattern": DURATION},
                },
            },
        },
    },
}


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` renders it."""
    with chart.Chart.load(CHART) as loaded:
        return loaded.render(values or {}, name=RELEASE, namespace=NAMESPACE)


def manifests(rendered: dict[str, str]) -> list[dict]:
    """The Kubernetes objects of a rendering (NOTES.txt and templates rendered empty left out)."""
    docs: list[dict] = []
    for path, text in rendered.items():
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d is not None)
    return docs


def find(docs: list[dict], kind: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def pod_spec(docs: list[dict]) -> dict:
    return find(docs, "Deployment")["spec"]["template"]["spec"]


def container(docs: list[dict]) -> dict:
    return next(c for c in pod_spec(docs)["containers"] if c["name"] == "sluice")


def write_like_kubelet(data: dict[str, str], directory: Path, version: str) -> None:
    """Writes (or updates) a ConfigMap volume as the kubelet does: the files in a hidden timestamped directory,
    `..data` linking to it, swapped by renaming a new link over it, and a symlink through `..data` per key."""
    real = directory / f"..{version}"
    real.mkdir(parents=True)
    for key, text in data.items():
        (real / key).write_text(text)
    (directory / "..data_tmp").symlink_to(real.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for key in data:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)
    for stale in directory.iterdir():
        if not stale.name.startswith(".") and stale.name not in data:
            stale.unlink()


def container_env(docs: list[dict]) -> dict[str, str]:
    """The container's environment with every secretKeyRef resolved from the rendered Secret."""
    secrets = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}
    env = {}
    for var in container(docs)["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] in secrets, f"{var['name']} reads Secret {ref['name']!r}, which the chart did not render"
        assert ref["key"] in secrets[ref["name"]], f"{var['name']} reads key {ref['key']!r} the Secret lacks"
        env[var["name"]] = base64.b64decode(secrets[ref["name"]][ref["key"]]).decode()
    return env


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def rlconfig(http_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/rlconfig", timeout=5) as r:
        return r.read().decode()


# ---------------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module", params=["default", "full"])
def rendered(request: pytest.FixtureRequest) -> dict[str, str]:
    return render(None if request.param == "default" else FULL)


@pytest.fixture(scope="module")
def docs(rendered: dict[str, str]) -> list[dict]:
    return manifests(rendered)


@pytest.fixture(scope="module")
def serve_env_names(sluice_bin: Path) -> set[str]:
    result = subprocess.run([str(sluice_bin), "serve", "--help"], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    # A secret's value is hidden: `[env: SLUICE_ADMIN_TOKEN]`, with no `=`.
    names = set(re.findall(r"\[env: ([A-Z0-9_]+)[=\]]", result.stdout))
    assert "SLUICE_REDIS_URL" in names, result.stdout
    return names


# ---------------------------------------------------------------------------------------------------------------
# Helm's own checks


@pytest.mark.parametrize("values", [None, FULL], ids=["default", "full"])
def test_lint_is_clean(values: dict | None):
    report = chart.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}", namespace=NAMESPACE)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == [], report
    # Severity 1 is information (Helm recommends an icon); 2 and 3 are warnings and errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_rendered_objects():
    default = sorted(d["kind"] for d in manifests(render()))
    full = sorted(d["kind"] for d in manifests(render(FULL)))
    assert default == ["ConfigMap", "Deployment", "Service"]
    assert full == sorted(
        default + ["Secret", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor", "NetworkPolicy"]
    )


def test_manifests_match_the_kubernetes_schema(docs: list[dict]):
    """Strict (unknown fields rejected), against Kubernetes 1.30, the chart's kubeVersion floor."""
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {e.message}")


def test_service_monitor_matches_its_crd_and_the_service():
    docs = manifests(render(FULL))
    monitor = find(docs, "ServiceMonitor")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    # Its metadata is an ObjectMeta like any object's: checked as a ConfigMap's.
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": monitor["metadata"]}, KUBERNETES_VERSION, strict=True
    )
    jsonschema.validate(monitor["spec"], SERVICE_MONITOR_SPEC)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"

    service = find(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items(), "the ServiceMonitor selects no Service"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "15s")

    bad = copy.deepcopy(monitor["spec"])
    bad["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SERVICE_MONITOR_SPEC)


# ---------------------------------------------------------------------------------------------------------------
# The values schema and the chart's refusals


@pytest.mark.parametrize(
    "values, named",
    [
        ({"replicaCount": "three"}, "/replicaCount"),
        ({"replicas": 2}, "replicas"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"autoscaling": {"enable": True}}, "enable"),
        ({"serviceMonitor": {"interval": "30 seconds"}}, "/serviceMonitor/interval"),
        ({"rules": {"files": {"edge.yaml": {"domain": "edge"}}}}, "/rules/files/edge.yaml"),
        ({"shutdown": {"drainSeconds": -1}}, "/shutdown/drainSeconds"),
        ({"logFormat": "xml"}, "/logFormat"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_schema_refuses_bad_values_by_name(values: dict, named: str):
    with pytest.raises(HelmValuesError) as refused:
        render(values)
    message = str(refused.value)
    assert named in message, message


@pytest.mark.parametrize(
    "values, named",
    [
        ({"replicaCount": 2}, "replicaCount 2 needs redis.url or redis.existingSecret"),
        ({"autoscaling": {"enabled": True}}, "autoscaling.enabled needs redis.url or redis.existingSecret"),
        ({"redis": {"url": "redis://r:6379", "existingSecret": "r"}}, "redis.url and redis.existingSecret"),
        ({"adminToken": {"value": "t", "existingSecret": "t"}}, "adminToken.value and adminToken.existingSecret"),
        # null removes a default key in Helm's values (an empty map would merge with the defaults).
        ({"rules": {"files": {"edge.yaml": None}}}, "rules.files is empty"),
        (
            {"redis": {"url": "redis://r:6379"}, "autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 2}},
            "autoscaling.maxReplicas 2 is below autoscaling.minReplicas 4",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_contradictory_values_are_refused_by_name(values: dict, named: str):
    with pytest.raises(HelmRenderError) as refused:
        render(values)
    assert named in str(refused.value), str(refused.value)


def test_existing_secrets_are_read_by_name():
    docs = manifests(
        render(
            {
                "replicaCount": 2,
                "redis": {"existingSecret": "redis-credentials", "existingSecretKey": "url"},
                "adminToken": {"existingSecret": "sluice-admin", "existingSecretKey": "token"},
            }
        )
    )
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart must not create a Secret for existing ones"
    refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in container(docs)["env"] if "valueFrom" in v}
    assert refs == {
        "SLUICE_REDIS_URL": {"name": "redis-credentials", "key": "url"},
        "SLUICE_ADMIN_TOKEN": {"name": "sluice-admin", "key": "token"},
    }
    # Nothing the chart renders changes with the Secret: no checksum to roll the pods.
    assert "checksum/secret" not in find(docs, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})


# ---------------------------------------------------------------------------------------------------------------
# The pod


def keys_anywhere(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node).union(*(keys_anywhere(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(keys_anywhere(v) for v in node))
    return set()


def test_no_subpath_and_the_rules_mount_as_a_directory(docs: list[dict]):
    for doc in docs:
        found = keys_anywhere(doc) & {"subPath", "subPathExpr"}
        assert not found, f"{doc['kind']} mounts with {found}: an edited ConfigMap would never reach the pod"
    args = container(docs)["args"]
    assert args[:2] == ["serve", "--config"]
    mounts = {m["mountPath"]: m for m in container(docs)["volumeMounts"]}
    mount = mounts[args[2]]
    assert mount["readOnly"] is True
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == find(docs, "ConfigMap")["metadata"]["name"]
    assert "items" not in volume["configMap"], "every key of the ConfigMap must be a file of the directory"


def test_pod_runs_locked_down(docs: list[dict]):
    pod = pod_spec(docs)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(docs)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container(docs)["resources"][kind].keys()


def test_probes_and_ports(docs: list[dict]):
    c = container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 8081, "http": 8080}
    assert (c["livenessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["port"]) == ("/healthz", "http")
    assert (c["readinessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["port"]) == ("/readyz", "http")
    service = find(docs, "Service")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"grpc": "grpc", "http": "http"}
    assert next(p for p in service["spec"]["ports"] if p["name"] == "grpc")["appProtocol"] == "grpc"


@pytest.mark.parametrize("shutdown", [None, {"preStopSleepSeconds": 0, "drainSeconds": 30}])
def test_termination_grace_covers_the_drain(shutdown: dict | None):
    docs = manifests(render(None if shutdown is None else {"shutdown": shutdown}))
    env = {v["name"]: v["value"] for v in container(docs)["env"] if "value" in v}
    drain = int(env["SLUICE_GRACE_PERIOD_SECS"])
    pre_stop = container(docs).get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if shutdown is not None:
        assert (pre_stop, drain) == (shutdown["preStopSleepSeconds"], shutdown["drainSeconds"])
    # The kubelet's clock starts with preStop; sluice's drain starts after it, at SIGTERM.
    assert pod_spec(docs)["terminationGracePeriodSeconds"] > pre_stop + drain


def test_selectors_select_the_pods(docs: list[dict]):
    labels = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = [find(docs, "Deployment")["spec"]["selector"]["matchLabels"], find(docs, "Service")["spec"]["selector"]]
    selectors += [c["labelSelector"]["matchLabels"] for c in pod_spec(docs)["topologySpreadConstraints"]]
    for d in docs:
        if d["kind"] == "PodDisruptionBudget":
            selectors.append(d["spec"]["selector"]["matchLabels"])
        if d["kind"] == "NetworkPolicy":
            selectors.append(d["spec"]["podSelector"]["matchLabels"])
        if d["kind"] == "HorizontalPodAutoscaler":
            assert d["spec"]["scaleTargetRef"]["name"] == find(docs, "Deployment")["metadata"]["name"]
            assert "replicas" not in find(docs, "Deployment")["spec"], "the HPA owns the replica count"
    for selector in selectors:
        assert selector and selector.items() <= labels.items(), f"{selector} does not select {labels}"


def test_network_policy_admits_the_service_ports():
    docs = manifests(render(FULL))
    policy = find(docs, "NetworkPolicy")
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert admitted == {p["name"] for p in container(docs)["ports"]}
    # Egress restricted to the Redis rule given, and DNS to find it.
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 6379}


def test_env_names_are_sluice_env_vars(docs: list[dict], serve_env_names: set[str]):
    for var in container(docs)["env"]:
        assert var["name"] in serve_env_names, f"{var['name']} is not read by `sluice serve`"


# ---------------------------------------------------------------------------------------------------------------
# Against a real sluice


def test_rules_configmap_passes_sluice_check(sluice_bin: Path, docs: list[dict], tmp_path: Path):
    data = find(docs, "ConfigMap")["data"]
    write_like_kubelet(data, tmp_path / "rules", "2026_01_01_00_00_00.000000001")
    result = subprocess.run(
        [str(sluice_bin), "check", "--config", str(tmp_path / "rules")],
        capture_output=True,
        text=True,
        timeout=10,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
    )
    assert result.returncode == 0, f"sluice check rejected the chart's rules:\n{result.stderr}"
    assert result.stdout.startswith(f"{len(data)} file(s), 1 domain(s)"), result.stdout
    assert "domain edge" in result.stdout


def test_rendered_pod_serves_on_redis_with_its_secrets(sluice_bin: Path, tmp_path: Path):
    """The container's arguments and environment, the Secret's values resolved, run a real sluice: it starts, reads
    the Redis URL (readiness pings that Redis) and guards the admin endpoints with the token."""
    with redis_server(tmp_path) as url:
        docs = manifests(render({**FULL, "redis": {"url": url}}))
        c = container(docs)
        env = container_env(docs)
        assert env["SLUICE_REDIS_URL"] == url and env["SLUICE_ADMIN_TOKEN"] == FULL["adminToken"]["value"]
        rules = tmp_path / "rules"
        write_like_kubelet(find(docs, "ConfigMap")["data"], rules, "2026_01_01_00_00_00.000000001")
        assert c["args"][:3] == ["serve", "--config", "/etc/sluice/config"]
        with running_sluice(sluice_bin, rules, tmp_path, extra_args=tuple(c["args"][3:]), env=env) as sluice:
            base = f"http://127.0.0.1:{sluice.http_port}"
            wait_until(lambda: http_status(f"{base}/readyz") == 200, 10, "sluice ready on Redis")
            offenders = f"{base}/offenders?domain=edge&span=minute"
            assert http_status(offenders) == 401
            assert http_status(offenders, {"Authorization": f"Bearer {env['SLUICE_ADMIN_TOKEN']}"}) == 200
            assert http_status(f"{base}/metrics") == 200
        # logFormat json: every log line is a JSON object.
        lines = [line for line in sluice.output.splitlines() if line.strip()]
        assert lines and all(json.loads(line) for line in lines), sluice.output


def test_edited_configmap_is_reloaded_without_a_restart(sluice_bin: Path, tmp_path: Path):
    before = manifests(render())
    rules = tmp_path / "rules"
    write_like_kubelet(find(before, "ConfigMap")["data"], rules, "2026_01_01_00_00_00.000000001")
    with running_sluice(sluice_bin, rules, tmp_path) as sluice:
        assert "edge.remote_address: 10 per second" in rlconfig(sluice.http_port)

        edited = {
            "rules": {
                "files": {
                    "edge.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n"
                    "    rate_limit: {unit: second, requests_per_unit: 7}\n",
                    "api.yaml": "domain: api\ndescriptors:\n  - key: user\n"
                    "    rate_limit: {unit: minute, requests_per_unit: 60}\n",
                }
            }
        }
        after = manifests(render(edited))
        # Only the ConfigMap changes: the pod template is the same, so upgrading the release rolls no pod.
        assert find(after, "Deployment") == find(before, "Deployment")
        write_like_kubelet(find(after, "ConfigMap")["data"], rules, "2026_01_01_00_01_00.000000002")

        def reloaded() -> bool:
            text = rlconfig(sluice.http_port)
            return "edge.remote_address: 7 per second" in text and "api.user: 60 per minute" in text

        wait_until(reloaded, 10, "the edited ConfigMap's rules in /rlconfig")
        assert sluice.proc.poll() is None
