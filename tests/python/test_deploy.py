"""The deployment files under deploy/ checked against the sluice they deploy, as far as a machine without a cluster,
an Istio control plane or a Docker engine allows.

What is checked against the real thing: flags and environment variables against `sluice serve --help`, embedded
configurations with `sluice check`, probe paths and ports against a running sluice, metric and label names against
that sluice's /metrics (and crates/sluice-core/src/metrics.rs for series that appear only on failures), the Istio patches against
Envoy's own protobuf definitions (PyPI `xds-protos`). promtool and kubectl, when installed, check the PromQL and the
kustomization too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
ISTIO = DEPLOY / "istio"
DASHBOARD = DEPLOY / "grafana" / "sluice-dashboard.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"

# A Helm chart's templates are Go templates, not YAML until rendered: tests/python/test_helm.py renders them.
YAML_FILES = sorted(
    p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and "templates" not in p.relative_to(DEPLOY).parts
)

# Labels Prometheus attaches to every scraped series, whatever the exporter says.
TARGET_LABELS = {"job", "instance"}
# Series Prometheus writes itself for every scrape target.
SYNTHETIC_METRICS = {"up"}
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "rate", "irate", "increase", "histogram_quantile",
    "vector", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "label_values", "offset", "time",
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def find(docs: Iterable[dict], kind: str, name: str | None = None) -> dict:
    matches = [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def help_options(text: str) -> dict[str, dict[str, str | None]]:
    """`--flag` -> its `env` and `default` as `sluice serve --help` prints them."""
    options: dict[str, dict[str, str | None]] = {}
    blocks = re.split(r"\n(?=\s*(?:-\w, )?--)", text)
    for block in blocks:
        m = re.match(r"\s*(?:-\w, )?--([a-z0-9-]+)", block)
        if not m:
            continue
        env = re.search(r"\[env: ([A-Z0-9_]+)=", block)
        default = re.search(r"\[default: ([^\]]+)\]", block)
        options[m.group(1)] = {
            "env": env.group(1) if env else None,
            "default": default.group(1) if default else None,
        }
    return options


def write_like_kubelet(configmap: dict, directory: Path) -> Path:
    """Writes a ConfigMap's data the way the kubelet mounts it: the files live in a hidden timestamped directory,
    `..data` links to it, and each key is a symlink through `..data`. sluice must read exactly the keys."""
    real = directory / "..2024_01_01_00_00_00.000000000"
    real.mkdir(parents=True)
    for key, text in configmap["data"].items():
        (real / key).write_text(text)
    (directory / "..data").symlink_to(real.name)
    for key in configmap["data"]:
        (directory / key).symlink_to(Path("..data") / key)
    return directory


def sluice_check(binary: Path, config: Path) -> str:
    result = subprocess.run(
        [str(binary), "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=10,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
    )
    assert result.returncode == 0, f"sluice check rejected {config}:\n{result.stderr}"
    return result.stdout


def port_number(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in by_name, f"port name {port!r} is not a container port ({sorted(by_name)})"
    return by_name[port]


# ---------------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def serve_help(sluice_bin: Path) -> str:
    result = subprocess.run([str(sluice_bin), "serve", "--help"], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def options(serve_help: str) -> dict[str, dict[str, str | None]]:
    parsed = help_options(serve_help)
    # Guards the parser itself: if the help format changed, every check below would pass vacuously.
    assert parsed.get("grpc-addr", {}).get("env") == "SLUICE_GRPC_ADDR", serve_help
    return parsed


@pytest.fixture(scope="module")
def k8s() -> list[dict]:
    return load_docs(KUBERNETES / "sluice.yaml")


@pytest.fixture(scope="module")
def deployment(k8s: list[dict]) -> dict:
    return find(k8s, "Deployment", "sluice")


@pytest.fixture(scope="module")
def container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "sluice")


@pytest.fixture(scope="module")
def metrics_rs() -> str:
    return (REPO / "crates" / "sluice-core" / "src" / "metrics.rs").read_text()


@pytest.fixture(scope="module")
def scraped(sluice_bin: Path, k8s: list[dict], container: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A sluice running on the Kubernetes ConfigMap's configuration, after one decision (so that the store
    histogram has samples): the /metrics text and the status of each probe path the Deployment uses."""
    import grpc
    from conftest import running_sluice
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2

    workdir = tmp_path_factory.mktemp("scrape")
    config = write_like_kubelet(find(k8s, "ConfigMap", "sluice-config"), workdir / "config")
    with running_sluice(sluice_bin, config, workdir) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            should_rate_limit = channel.unary_unary(
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
                response_deserializer=rls_pb2.RateLimitResponse.FromString,
            )
            entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="path", value="/login")
            request = rls_pb2.RateLimitRequest(
                domain="edge", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
            )
            response = should_rate_limit(request, timeout=5)
            assert response.overall_code == rls_pb2.RateLimitResponse.OK

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, ""

        probes = {}
        for probe in ("livenessProbe", "readinessProbe"):
            path = container[probe]["httpGet"]["path"]
            probes[path] = get(path)[0]
        _, text = get("/metrics")
    return {"metrics": text, "probes": probes}


@pytest.fixture(scope="module")
def known(scraped: dict, metrics_rs: str) -> dict[str, set[str]]:
    """Metric name -> label names: every series the running sluice exposes, plus the names crates/sluice-core/src/metrics.rs
    declares (some, like store errors, appear only once something failed)."""
    labels: dict[str, set[str]] = {}
    for line in scraped["metrics"].splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? ", line)
        if m and not line.startswith("#"):
            names = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(2) or ""))
            labels.setdefault(m.group(1), set()).update(names)
    declared_labels = set(re.findall(r'Label::(?:new|from_static_parts)\(\s*"([a-z_]+)"', metrics_rs))
    assert declared_labels, "no label names found in crates/sluice-core/src/metrics.rs"
    for name in re.findall(r'pub const [A-Z_]+: &str = "(sluice_[a-z0-9_]+)"', metrics_rs):
        # A name only crates/sluice-core/src/metrics.rs knows gets every label crates/sluice-core/src/metrics.rs uses: the best that can be said unseen.
        labels.setdefault(name, set(declared_labels))
    assert any(n.endswith("_bucket") for n in labels), "the store histogram was not exported after a decision"
    return labels


# ---------------------------------------------------------------------------------------------------------------
# Every YAML file


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_yaml_parses(path: Path):
    docs = load_docs(path)
    assert docs, f"{path} holds no document"


def test_all_deploy_files_are_covered():
    names = {str(p.relative_to(DEPLOY)) for p in YAML_FILES}
    for expected in (
        "kubernetes/sluice.yaml",
        "kubernetes/redis.yaml",
        "kubernetes/kustomization.yaml",
        "istio/sluice-config.yaml",
        "prometheus/alerts.yaml",
    ):
        assert expected in names


# ---------------------------------------------------------------------------------------------------------------
# Kubernetes


def test_container_args_are_sluice_flags(container: dict, options: dict, deployment: dict):
    args = container["args"]
    assert args[0] == "serve"
    flags = [a.split("=", 1)[0][2:] for a in args if a.startswith("--")]
    assert flags, args
    for flag in flags:
        assert flag in options, f"`sluice serve` has no --{flag} (it has {sorted(options)})"
    config_dir = args[args.index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert config_dir in mounts, f"--config {config_dir} is not a mounted volume"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[config_dir]]["configMap"]["name"] == "sluice-config"


def test_container_env_names_are_sluice_env_vars(container: dict, options: dict):
    known_env = {o["env"] for o in options.values() if o["env"]}
    for var in container["env"]:
        assert var["name"] in known_env, f"{var['name']} is not read by `sluice serve` ({sorted(known_env)})"
    env = {var["name"]: var["value"] for var in container["env"]}
    assert env.get("SLUICE_REDIS_URL") == "redis://redis:6379"


def test_ports_match_sluice_defaults(container: dict, options: dict, k8s: list[dict]):
    # The container does not pass --grpc-addr/--http-addr, so sluice listens on its defaults.
    assert "--grpc-addr" not in container["args"] and "--http-addr" not in container["args"]
    grpc_port = int(options["grpc-addr"]["default"].rsplit(":", 1)[1])
    http_port = int(options["http-addr"]["default"].rsplit(":", 1)[1])
    assert (grpc_port, http_port) == (8081, 8080)
    assert port_number(container, "grpc") == grpc_port
    assert port_number(container, "http") == http_port

    service = find(k8s, "Service", "sluice")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["port"] == grpc_port
    assert port_number(container, ports["grpc"]["targetPort"]) == grpc_port
    # Without it Istio and other meshes would not speak HTTP/2 to the port.
    assert ports["grpc"]["appProtocol"] == "grpc"
    assert ports["http"]["port"] == http_port
    assert port_number(container, ports["http"]["targetPort"]) == http_port


def test_probes_use_sluice_http_endpoints(container: dict):
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert (liveness["path"], port_number(container, liveness["port"])) == ("/healthz", 8080)
    assert (readiness["path"], port_number(container, readiness["port"])) == ("/readyz", 8080)


def test_probe_paths_answer_200_on_a_running_sluice(scraped: dict):
    assert scraped["probes"] == {"/healthz": 200, "/readyz": 200}


def test_selectors_match_pod_labels(k8s: list[dict], deployment: dict):
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        find(k8s, "Service", "sluice")["spec"]["selector"],
        find(k8s, "PodDisruptionBudget", "sluice")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items(), f"{selector} does not select {pod_labels}"


def test_pod_runs_locked_down(deployment: dict, container: dict):
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys()


def test_termination_grace_covers_sluice_drain(deployment: dict, container: dict, options: dict):
    env = {var["name"]: var["value"] for var in container["env"]}
    grace = int(env.get("SLUICE_GRACE_PERIOD_SECS", options["grace-period-secs"]["default"]))
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    # The kubelet's clock starts with preStop; sluice's drain starts after it, at SIGTERM.
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > pre_stop + grace
    assert deployment["spec"]["replicas"] == 2


def test_kubernetes_configmap_passes_sluice_check(sluice_bin: Path, k8s: list[dict], tmp_path: Path):
    configmap = find(k8s, "ConfigMap", "sluice-config")
    summary = sluice_check(sluice_bin, write_like_kubelet(configmap, tmp_path / "config"))
    assert f"{len(configmap['data'])} file(s)" in summary, summary
    assert "domain edge" in summary


def test_kustomization_lists_the_manifests():
    kustomization = load_docs(KUBERNETES / "kustomization.yaml")[0]
    assert set(kustomization["resources"]) == {"sluice.yaml", "redis.yaml"}
    for resource in kustomization["resources"]:
        assert (KUBERNETES / resource).is_file()


def test_redis_service_matches_sluice_redis_url(container: dict):
    redis = load_docs(KUBERNETES / "redis.yaml")
    env = {var["name"]: var["value"] for var in container["env"]}
    host, port = env["SLUICE_REDIS_URL"].removeprefix("redis://").split(":")
    service = find(redis, "Service", host)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    pod_labels = find(redis, "Deployment", "redis")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds():
    result = subprocess.run(["kubectl", "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(result.stdout) if d)
    assert kinds == sorted(["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "Deployment", "Service"])
    assert all(d["metadata"]["namespace"] == "sluice" for d in yaml.safe_load_all(result.stdout) if d)


def test_manifests_match_the_kubernetes_schema():
    """Strict schema validation (unknown fields rejected) against Kubernetes 1.30, the first release whose
    preStop `sleep` action is on by default. Needs PyPI `kubernetes-validate`, which bundles the schemas."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for path in (KUBERNETES / "sluice.yaml", KUBERNETES / "redis.yaml", ISTIO / "sluice-config.yaml"):
        for doc in load_docs(path):
            try:
                kubernetes_validate.validate(doc, "1.30.0", strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {e.message}")


# ---------------------------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_runs_sluice_with_its_defaults(options: dict):
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM rust:1-bookworm AS build$", text, re.MULTILINE)
    assert "--bin sluice" in text
    assert re.search(r"^USER 65532:65532$", text, re.MULTILINE), "the runtime image must not run as root"
    exposed = set(re.search(r"^EXPOSE (.+)$", text, re.MULTILINE).group(1).split())
    # sluice's own ports, and the reference's admin and Prometheus ports for the image run as /bin/ratelimit.
    assert exposed == {"8080", "8081", "6070", "9090"}
    # /bin/ratelimit is a link to the binary (the reference's image starts /bin/ratelimit), kept a link by copying
    # its directory; the binary run under that name reads the reference's variables (tests/compat.rs runs it so).
    link = re.search(r"ln -s (\S+) /out/bin/ratelimit", text)
    assert link and link.group(1) == "/usr/local/bin/sluice"
    assert re.search(r"cp target/release/sluice /out/usr/local/bin/sluice", text)
    assert re.search(r"^COPY --from=build /out/ /$", text, re.MULTILINE)
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.MULTILINE).group(1))
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.MULTILINE).group(1))
    assert entrypoint[0].endswith("/sluice")
    assert cmd[0] == "serve"
    for flag in (a[2:] for a in cmd if a.startswith("--")):
        assert flag in options
    config = cmd[cmd.index("--config") + 1]
    copy = re.search(r"^COPY deploy/config/ (\S+)$", text, re.MULTILINE)
    assert copy and copy.group(1).rstrip("/") == config
    # The binary the build copies out must be the one the service's Cargo.toml builds.
    assert re.search(r'\[\[bin\]\]\s*name = "sluice"', (REPO / "crates" / "sluice" / "Cargo.toml").read_text())


# ---------------------------------------------------------------------------------------------------------------
# Istio


@pytest.fixture(scope="module")
def istio() -> dict:
    return {
        "filter": find(load_docs(ISTIO / "ratelimit-filter.yaml"), "EnvoyFilter"),
        "actions": find(load_docs(ISTIO / "ratelimit-actions.yaml"), "EnvoyFilter"),
        "config": find(load_docs(ISTIO / "sluice-config.yaml"), "ConfigMap"),
    }


def ratelimit_filter(istio: dict) -> dict:
    (patch,) = [p for p in istio["filter"]["spec"]["configPatches"] if p["applyTo"] == "HTTP_FILTER"]
    assert patch["patch"]["value"]["name"] == "envoy.filters.http.ratelimit"
    return patch["patch"]["value"]["typed_config"]


def test_istio_filter_is_valid_envoy_config(istio: dict):
    from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
    from google.protobuf import json_format

    typed = dict(ratelimit_filter(istio))
    assert typed.pop("@type") == "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    # Envoy's own message definition rejects unknown fields and enum values, as Envoy would.
    config = json_format.ParseDict(typed, rate_limit_pb2.RateLimit())
    assert config.domain == "edge"
    assert config.failure_mode_deny is False
    assert config.timeout.ToTimedelta().total_seconds() > 0
    assert rate_limit_pb2.RateLimit.XRateLimitHeadersRFCVersion.Name(config.enable_x_ratelimit_headers) == (
        "DRAFT_VERSION_03"
    )
    api_version = config.rate_limit_service.DESCRIPTOR.fields_by_name["transport_api_version"].enum_type
    assert api_version.values_by_number[config.rate_limit_service.transport_api_version].name == "V3"


def test_istio_filter_targets_the_sluice_service(istio: dict, k8s: list[dict]):
    grpc_service = ratelimit_filter(istio)["rate_limit_service"]["grpc_service"]["envoy_grpc"]
    namespace = load_docs(KUBERNETES / "kustomization.yaml")[0]["namespace"]
    service = find(k8s, "Service", "sluice")
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    fqdn = f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    assert grpc_service["cluster_name"] == f"outbound|{grpc_port}||{fqdn}"
    assert grpc_service["authority"] == fqdn
    assert istio["config"]["metadata"]["namespace"] == namespace


def test_istio_actions_are_valid_envoy_config(istio: dict):
    from envoy.config.route.v3 import route_components_pb2
    from google.protobuf import json_format

    (patch,) = istio["actions"]["spec"]["configPatches"]
    assert patch["applyTo"] == "VIRTUAL_HOST" and patch["patch"]["operation"] == "MERGE"
    vhost = json_format.ParseDict(patch["patch"]["value"], route_components_pb2.VirtualHost())
    kinds = [action.WhichOneof("action_specifier") for rl in vhost.rate_limits for action in rl.actions]
    assert kinds == ["remote_address", "request_headers"]
    assert vhost.rate_limits[1].actions[0].request_headers.header_name == ":path"


def test_istio_descriptors_have_rules_in_the_sluice_config(istio: dict, sluice_bin: Path, tmp_path: Path):
    configmap = istio["config"]
    summary = sluice_check(sluice_bin, write_like_kubelet(configmap, tmp_path / "config"))
    (text,) = configmap["data"].values()
    config = yaml.safe_load(text)
    assert config["domain"] == ratelimit_filter(istio)["domain"]
    assert f"domain {config['domain']}" in summary
    rule_keys = {d["key"] for d in config["descriptors"]}
    (patch,) = istio["actions"]["spec"]["configPatches"]
    for rate_limit in patch["patch"]["value"]["rate_limits"]:
        for action in rate_limit["actions"]:
            # Envoy's descriptor key for each action: remote_address sends "remote_address".
            key = action["request_headers"]["descriptor_key"] if "request_headers" in action else next(iter(action))
            assert key in rule_keys, f"Envoy sends descriptor key {key!r}, for which sluice has no rule"


# ---------------------------------------------------------------------------------------------------------------
# Metrics: the Grafana dashboard and the alert rules


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label matchers, ranges and
    grouping clauses are removed, less PromQL's own words."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", " ", stripped)
    stripped = re.sub(r"\[[^\]]*\]", " ", stripped)
    stripped = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", stripped)
    return {w for w in re.findall(r"(?<![\w$.])[a-zA-Z_:][a-zA-Z0-9_:]*", stripped)} - PROMQL_WORDS


def promql_labels(expr: str) -> set[str]:
    """The label names an expression matches on or groups by."""
    names = set()
    for matchers in re.findall(r"\{([^}]*)\}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        names.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        names.update(n.strip() for n in grouping.split(",") if n.strip())
    return names


def check_expr(expr: str, known: dict[str, set[str]], where: str) -> set[str]:
    metrics = promql_metrics(expr)
    assert metrics, f"{where}: no metric found in {expr!r}"
    allowed = set(TARGET_LABELS) | {"le"}
    for metric in metrics:
        assert metric in known or metric in SYNTHETIC_METRICS, f"{where}: sluice exports no metric {metric!r}"
        allowed |= known.get(metric, set())
    unknown = promql_labels(expr) - allowed
    assert not unknown, f"{where}: labels {sorted(unknown)} do not exist on {sorted(metrics)}"
    return allowed


def dashboard_targets(dashboard: dict) -> list[tuple[str, dict]]:
    targets = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            targets.append((panel["title"], target))
    return targets


def grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "5m").replace("$domain", ".*")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_shape(dashboard: dict):
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for title, target in dashboard_targets(dashboard):
        assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", title
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_dashboard_references_only_exported_metrics(dashboard: dict, known: dict[str, set[str]]):
    targets = dashboard_targets(dashboard)
    assert len(targets) >= 10
    for title, target in targets:
        allowed = check_expr(grafana_to_promql(target["expr"]), known, f"panel {title!r}")
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= allowed, f"panel {title!r}: legend uses {sorted(legend - allowed)}"
    # Names mentioned anywhere (descriptions, variables) must exist too.
    for name in set(re.findall(r"\bsluice_[a-z0-9_]+", DASHBOARD.read_text())):
        assert name in known, f"the dashboard mentions {name}, which sluice does not export"
    for variable in dashboard["templating"]["list"]:
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"]).groups()
        assert label in known.get(metric, set()), f"variable {variable['name']}: {metric} has no label {label}"


def test_dashboard_covers_every_sluice_metric(dashboard: dict, metrics_rs: str):
    # Hits minus over-limit hits: a panel of its own would repeat the two panels that show them.
    derivable = {"sluice_rule_within_limit_total"}
    text = json.dumps(dashboard)
    for name in re.findall(r'pub const [A-Z_]+: &str = "(sluice_[a-z0-9_]+)"', metrics_rs):
        assert name in text or name in derivable, f"the dashboard shows nothing of {name}"


@pytest.fixture(scope="module")
def alert_rules() -> list[dict]:
    groups = load_docs(ALERTS)[0]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alerts_reference_only_exported_metrics(alert_rules: list[dict], known: dict[str, set[str]]):
    names = {rule["alert"] for rule in alert_rules}
    assert {"SluiceHighDenyRate", "SluiceStoreErrors", "SluiceStoreLatencyHigh", "SluiceDown"} <= names
    for rule in alert_rules:
        allowed = check_expr(rule["expr"], known, f"alert {rule['alert']}")
        assert rule["labels"]["severity"] in ("warning", "critical")
        templated = set()
        for text in rule["annotations"].values():
            templated.update(re.findall(r"\$labels\.(\w+)", text))
        assert templated <= allowed, f"alert {rule['alert']}: annotations use {sorted(templated - allowed)}"
    for name in set(re.findall(r"\bsluice_[a-z0-9_]+", ALERTS.read_text())):
        assert name in known, f"the alerts mention {name}, which sluice does not export"


def test_down_alert_uses_up(alert_rules: list[dict]):
    (down,) = [r for r in alert_rules if r["alert"] == "SluiceDown"]
    assert re.fullmatch(r'up\{job="[^"]+"\} == 0', down["expr"].strip())


PROMTOOL = os.environ.get("PROMTOOL") or shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package `prometheus`)")
def test_promtool_accepts_alerts_and_dashboard_queries(dashboard: dict, tmp_path: Path):
    result = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    # The dashboard's queries, as recording rules, so promtool parses them too.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(target["expr"])}
        for i, (_, target) in enumerate(dashboard_targets(dashboard))
    ]
    queries = tmp_path / "dashboard-queries.yaml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(queries)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
