"""deploy/: what can be checked without Docker, Kubernetes or systemd running.

Manifests parse; the command lines they give tinyhal-serve parse with its own argument
parser; probes, health checks and scrape paths name routes the real server answers; every
metric the alert rules and the dashboard query is one the real server exposes; the systemd
unit passes `systemd-analyze verify` and the rules pass `promtool` where those exist.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tinyhal.server.main import _parser

pytestmark = pytest.mark.timeout(120)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _exposed_metric_names(server) -> set[str]:
    status, _, body = server.request("GET", "/metrics")
    assert status == 200
    return {line.split("{")[0].split(" ")[0] for line in body.decode().splitlines()
            if line and not line.startswith("#")}


def _queried_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\btinyhal_[a-z_]+", expr))


def test_every_yaml_file_parses():
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(files) >= 5
    for path in files:
        assert _yaml_docs(path), path


def test_deployment_probes_annotations_and_drain():
    docs = {d["kind"]: d for d in _yaml_docs(DEPLOY / "kubernetes/tinyhal-serve.yaml")}
    pod = docs["Deployment"]["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    (container,) = pod["spec"]["containers"]
    args = _parser().parse_args(container["args"])
    assert str(args.port) == annotations["prometheus.io/port"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == args.port  # a number: no curl, no name
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["spec"]["terminationGracePeriodSeconds"] > args.drain_timeout + 5
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    service = docs["Service"]
    assert service["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]


def _control_locked_down(container: dict, volumes: list[dict]) -> None:
    """Load/unload refused, the repository group behind a header whose value the server
    reads from a Secret (its mounted file, or an environment variable set from it; never
    the command line), and the probes' routes in no restricted group."""
    from tinyhal.server.app import api_group
    from tinyhal.server.main import _parse_restricted

    args = _parser().parse_args(container["args"])
    assert args.model_control_mode == "none"
    restricted = _parse_restricted(args.http_restricted_api, read_secrets=False)
    header, value = restricted["model-repository"]
    if value.startswith("@"):
        (mount,) = [m for m in container["volumeMounts"]
                    if value[1:].startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in volumes if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"]
    else:
        var = re.fullmatch(r"env:(\w+)", value).group(1)
        (env,) = [e for e in container["env"] if e["name"] == var]
        assert env["valueFrom"]["secretKeyRef"]["name"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            assert api_group(container[probe]["httpGet"]["path"]) not in restricted


def test_control_endpoints_are_not_reachable_cluster_wide():
    docs = {d["kind"]: d for d in _yaml_docs(DEPLOY / "kubernetes/tinyhal-serve.yaml")}
    deployment = docs["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    _control_locked_down(container, deployment["spec"]["template"]["spec"]["volumes"])
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == deployment["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"] and policy["ingress"][0]["from"]
    (runtime,) = _yaml_docs(DEPLOY / "kserve/serving-runtime.yaml")
    (container,) = runtime["spec"]["containers"]
    _control_locked_down(container, runtime["spec"].get("volumes", []))


def test_kserve_runtime_and_inference_service_agree():
    (runtime,) = _yaml_docs(DEPLOY / "kserve/serving-runtime.yaml")
    (isvc,) = _yaml_docs(DEPLOY / "kserve/inference-service.yaml")
    assert runtime["kind"] == "ServingRuntime" and "v2" in runtime["spec"]["protocolVersions"]
    (container,) = runtime["spec"]["containers"]
    args = _parser().parse_args(container["args"])
    assert str(args.model_repository) == "/mnt/models"  # KServe's storage initializer
    assert container["readinessProbe"]["httpGet"]["port"] == args.port
    model = isvc["spec"]["predictor"]["model"]
    assert isvc["kind"] == "InferenceService" and model["protocolVersion"] == "v2"
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats


def _dockerfile() -> dict[str, list[str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_dockerfile_runs_what_the_tests_run(server):
    docker = _dockerfile()
    assert docker["USER"][-1].split(":")[0] not in ("root", "0")
    assert docker["EXPOSE"] == ["8000"]
    entry = json.loads(docker["ENTRYPOINT"][-1])
    assert entry[0] == "tinyhal-serve"
    args = _parser().parse_args(entry[1:])
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert "pip install" in " ".join(docker["RUN"])
    # the HEALTHCHECK command itself, pointed at a real server
    health = docker["HEALTHCHECK"][-1]
    assert "/v2/health/ready" in health
    cmd = json.loads(health[health.index("CMD") + 3:].strip())
    assert cmd[0] == "python"
    cmd = [sys.executable, *cmd[1:]]
    cmd[-1] = cmd[-1].replace("127.0.0.1:8000", server.url)
    assert subprocess.run(cmd, timeout=30).returncode == 0


def test_systemd_unit(tmp_path):
    unit = (DEPLOY / "systemd/tinyhal-serve.service").read_text()
    joined = unit.replace("\\\n", " ")  # systemd's line continuations
    argv = shlex.split(re.search(r"^ExecStart=(.*)$", joined, re.M).group(1))
    assert argv[0].endswith("/tinyhal-serve")
    args = _parser().parse_args(argv[1:])
    stop = int(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1))
    assert stop > args.drain_timeout
    for option in ("KillSignal=SIGTERM", "Restart=on-failure", "NoNewPrivileges=yes",
                   "ProtectSystem=strict", "DynamicUser=yes"):
        assert option in unit
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian: apt-get install systemd)")
    local = tmp_path / "tinyhal-serve.service"
    local.write_text(unit.replace(argv[0], f"{sys.executable} -m tinyhal.server.main"))
    proc = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_and_dashboard_query_metrics_the_server_exposes(server):
    exposed = _exposed_metric_names(server)
    rules = _yaml_docs(DEPLOY / "prometheus/alerts.yml")[0]["groups"][0]["rules"]
    assert any("tinyhal_device_memory_peak_bytes" in r["expr"] for r in rules)
    queried = set()
    for rule in rules:
        queried |= _queried_metrics(rule["expr"])
    dashboard = json.loads((DEPLOY / "grafana/tinyhal-serve-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried |= _queried_metrics(target["expr"])
    missing = queried - exposed
    assert not missing, f"queried but not exposed: {sorted(missing)}"
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        config = _yaml_docs(DEPLOY / "prometheus" / name)[0]
        assert config["rule_files"] == ["alerts.yml"]
        assert all(job["metrics_path"] == "/metrics" for job in config["scrape_configs"]
                   if "metrics_path" in job)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return subprocess.run([promtool, *args], cwd=DEPLOY / "prometheus", capture_output=True,
                          text=True, timeout=60)


def test_promtool_checks_the_config_and_unit_tests_every_alert():
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        proc = _promtool(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for r in _yaml_docs(DEPLOY / "prometheus/alerts.yml")[0]["groups"][0]
              ["rules"]}
    tested = {case["alertname"] for test in _yaml_docs(DEPLOY / "prometheus/alerts_test.yml")[0]
              ["tests"] for case in test["alert_rule_test"]}
    assert tested == alerts


def test_the_kubernetes_scrape_config_is_the_static_one_with_pod_discovery():
    static = _yaml_docs(DEPLOY / "prometheus/prometheus.yml")[0]
    kubernetes = _yaml_docs(DEPLOY / "prometheus/prometheus-kubernetes.yml")[0]
    assert {k: v for k, v in kubernetes.items() if k != "scrape_configs"} == \
        {k: v for k, v in static.items() if k != "scrape_configs"}
    (job,) = kubernetes["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    proc = _promtool("check", "config", "prometheus-kubernetes.yml")
    if "field kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        pytest.skip("this promtool is built without Kubernetes service discovery, as "
                    "Debian's is; the upstream release checks prometheus-kubernetes.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_covers_every_file():
    readme = (DEPLOY / "README.md").read_text()
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.name != "README.md":
            assert path.name in readme, path.name


def _kubernetes_docs() -> list[tuple[str, dict]]:
    return [(f"{path.parent.name}/{path.name}", doc)
            for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")) +
            sorted((DEPLOY / "kserve").glob("*.yaml"))
            for doc in _yaml_docs(path)]


def test_manifests_validate_against_the_kubernetes_api_schemas():
    """kubernetes-validate (schemas bundled, offline), strict: unknown fields fail too.
    KServe's CRDs (InferenceService, ServingRuntime) have no schema there."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    validated, crds = [], []
    for where, doc in _kubernetes_docs():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            validated.append(doc["kind"])
        except kubernetes_validate.SchemaNotFoundError:
            crds.append(doc["kind"])
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} {doc['kind']}: {exc.message}")
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ConfigMap"} <= set(validated)
    assert set(crds) <= {"InferenceService", "ServingRuntime"}
    # the validator does catch mistakes: a misspelt field and a wrong type
    deployment = next(d for _, d in _kubernetes_docs() if d["kind"] == "Deployment")
    for broken in ({**deployment, "spec": {**deployment["spec"], "replica": 2}},
                   {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


def test_autoscaler_and_disruption_budget_target_the_deployment(server):
    docs = _yaml_docs(DEPLOY / "kubernetes/tinyhal-serve.yaml")
    kinds = {d["kind"]: d for d in docs}
    deployment = kinds["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = kinds["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] < deployment["spec"]["replicas"]
    adapter = {d["kind"]: d for d in _yaml_docs(DEPLOY / "kubernetes/hpa-prometheus-adapter.yaml")}
    for hpa in (kinds["HorizontalPodAutoscaler"], adapter["HorizontalPodAutoscaler"]):
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment",
                                                   deployment["metadata"]["name"])
        assert hpa["spec"]["minReplicas"] >= pdb["minAvailable"] + 1
    rules = yaml.safe_load(adapter["ConfigMap"]["data"]["config.yaml"])["rules"]
    (rule,) = rules
    metric = adapter["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]
    assert rule["name"]["as"] == metric["name"]
    queried = _queried_metrics(rule["seriesQuery"] + rule["metricsQuery"])
    assert queried and queried <= _exposed_metric_names(server)
