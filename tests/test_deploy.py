"""The deployment files agree with the service: probes, ports and settings names are real."""

import pytest

from service.app import create_app
from service.settings import Settings

from conftest import ROOT

yaml = pytest.importorskip("yaml")
DEPLOY = ROOT / "deploy"


def load(name: str):
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def app_paths() -> set[str]:
    spec = create_app(Settings(models_dir="/nonexistent")).openapi()
    return set(spec["paths"])


def container():
    [deployment] = load("deployment.yaml")
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def test_probes_point_at_the_health_endpoints():
    _, c = container()
    paths = app_paths()
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] in paths
        assert c[probe]["httpGet"]["port"] == "http"


def test_ports_agree():
    deployment, c = container()
    env = {e["name"]: e.get("value") for e in c["env"]}
    [port] = [p for p in c["ports"] if p["name"] == "http"]
    assert port["containerPort"] == int(env["NMT_PORT"]) == Settings().port
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] in app_paths()
    [service] = load("service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_env_names_are_real_settings():
    _, c = container()
    fields = {f"NMT_{name.upper()}" for name in Settings.model_fields}
    for entry in c["env"]:
        assert entry["name"] in fields, f"{entry['name']} is not a setting"
    # and the values parse as the settings they name
    values = {e["name"][4:].lower(): e["value"] for e in c["env"] if "value" in e}
    Settings(**values)


def test_resources_and_autoscaler():
    deployment, c = container()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > Settings().graceful_shutdown_s
    [hpa] = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_dockerfile_matches_the_service():
    text = (ROOT / "Dockerfile").read_text()
    assert "EXPOSE 8000" in text and "/health/ready" in text and "USER app" in text
    for line in text.splitlines():
        for token in line.replace("\\", " ").split():
            if token.startswith("NMT_") and "=" in token:
                name = token.split("=")[0]
                assert name[4:].lower() in Settings.model_fields, name
