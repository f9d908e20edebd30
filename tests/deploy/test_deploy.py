"""The Helm chart in deploy/helm renders, validates against the Kubernetes API schemas, and agrees with the
service: probes, ports, NMT_* names and the autoscaling metric are the service's real ones.

The chart is rendered by Helm's own Go template engine (helm-python-sdk ships it as a library, no helm
binary), and every object of a core API group is checked by kubernetes-validate in strict mode (unknown
fields fail) against the schemas of Kubernetes KUBE_VERSION. CRD objects (ServiceMonitor, ScaledObject)
have no schema there and get field checks here instead.
"""

import copy
import re

import pytest
from conftest import ROOT

from nmt_serve.service.app import create_app
from nmt_serve.service.metrics import ENGINE_GAUGES, EngineCollector
from nmt_serve.service.settings import Settings

yaml = pytest.importorskip("yaml")
helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = ROOT / "deploy" / "helm" / "nmt-serve"
ADAPTER_VALUES = ROOT / "deploy" / "helm" / "prometheus-adapter-values.yaml"
GPU_VALUES = ROOT / "deploy" / "helm" / "values-gpu.yaml"
KUBE_VERSION = "1.30.0"  # the chart's kubeVersion floor; kubernetes-validate ships its schemas
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"), ("keda.sh/v1alpha1", "ScaledObject")}

BASE = {"image": {"registry": "registry.example.com/team"}, "apiKeys": {"existingSecret": "nmt-serve-keys"}}
# a ReadWriteMany claim for the jobs: more than one replica (or an autoscaler that may make more) needs one
SHARED_JOBS = {"jobs": {"existingClaim": "nmt-jobs"}}
REFUSED_WITHOUT_CLAIM = "jobs.existingClaim is required with more than one replica"


def merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        stack = [(out, layer)]
        while stack:
            into, src = stack.pop()
            for k, v in src.items():
                if isinstance(v, dict) and isinstance(into.get(k), dict):
                    stack.append((into[k], v))
                else:
                    into[k] = copy.deepcopy(v)
    return out


VARIANTS = {
    "cpu": BASE,
    "cpu-two-replicas": merged(BASE, {"replicaCount": 2}, SHARED_JOBS),
    "gpu": merged(BASE, yaml.safe_load(GPU_VALUES.read_text()), SHARED_JOBS),
    "cpu-autoscaling": merged(BASE, {"autoscaling": {"enabled": True}}, SHARED_JOBS),
    "gpu-no-autoscaling": merged(BASE, yaml.safe_load(GPU_VALUES.read_text()), {"autoscaling": {"enabled": False}}),
    "keda": merged(BASE, {"autoscaling": {"enabled": True, "mode": "keda"}}, SHARED_JOBS),
    "no-keys": merged(BASE, {"apiKeys": {"enabled": False, "existingSecret": ""}}),
    "servicemonitor-token": merged(BASE, {"metrics": {"scrape": "serviceMonitor",
                                                      "tokenSecret": {"name": "nmt-serve-metrics"}}}),
    "alerts": merged(BASE, {"metrics": {"scrape": "serviceMonitor", "alerts": {"enabled": True, "labels": {"release": "prometheus"}}}}),
    "dashboard": merged(BASE, {"metrics": {"dashboard": {"enabled": True}}}),
    "models-volume": merged(BASE, {"models": {"volume": {"persistentVolumeClaim": {"claimName": "models",
                                                                                   "readOnly": True}}}}),
}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="nmt", namespace="translation")
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(values) for name, values in VARIANTS.items()}


def kinds(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        assert d["kind"] not in out, f"two {d['kind']} objects"
        out[d["kind"]] = d
    return out


def pod_spec(docs):
    return kinds(docs)["Deployment"]["spec"]["template"]["spec"]


def container(docs):
    [c] = pod_spec(docs)["containers"]
    return c


def env(docs) -> dict[str, dict]:
    return {e["name"]: e for e in container(docs)["env"]}


def app_paths() -> set[str]:
    spec = create_app(Settings(models_dir="/nonexistent")).openapi()
    return set(spec["paths"])


def exposed_engine_metrics() -> set[str]:
    """Names the engine collector writes into /metrics once the engine has published its statistics."""
    collector = EngineCollector()
    collector.stats = {key: 1.0 for key in ENGINE_GAUGES}
    return {family.name for family in collector.collect()}


def render_error(values: dict) -> str:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    return str(caught.value)


# --------------------------------------------------------------------------------------------- the chart


def test_lint_is_clean():
    report = helm.lint(str(CHART), BASE, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_validates_strictly(rendered, variant):
    docs = rendered[variant]
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= set(kinds(docs))
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_validator_is_strict():
    # a misspelt field must fail, or the test above proves nothing
    [deployment] = [d for d in render(BASE) if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


# --------------------------------------------------------------------------------------------- safety


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_restricted_pod_security_standard(rendered, variant):
    spec = pod_spec(rendered[variant])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not sc.get("privileged")
        assert all("hostPort" not in p for p in c.get("ports", []))
    allowed = {"emptyDir", "secret", "configMap", "persistentVolumeClaim", "projected", "downwardAPI", "ephemeral", "csi"}
    for volume in spec.get("volumes", []):
        assert set(volume) - {"name"} <= allowed, volume
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tmp_is_writable_on_the_read_only_root(rendered, variant):
    # the engine's socket directory and the translated-file store are made with tempfile (under /tmp)
    spec = pod_spec(rendered[variant])
    mounts = {m["mountPath"]: m["name"] for m in container(rendered[variant])["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    # the engines' shared weights (settings.shared_weights): in memory, more than a container's own 64 MB
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["sizeLimit"] == "1Gi"
    # caches (CUDA's kernel cache, ~/.cache) land there too, not in the read-only home directory
    variables = env(rendered[variant])
    for name in ("HOME", "XDG_CACHE_HOME", "CUDA_CACHE_PATH"):
        assert variables[name]["value"].startswith("/tmp"), name


def test_pod_runs_as_the_images_user(rendered):
    """runAsUser is the uid the Dockerfile gives its user `app`, so files it owns stay readable."""
    import re

    uid = re.search(r"useradd[^\n]*--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1)
    assert pod_spec(rendered["cpu"])["securityContext"]["runAsUser"] == int(uid)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_image_has_a_registry_and_a_version(rendered, variant):
    image = container(rendered[variant])["image"]
    registry, rest = image.split("/", 1)
    assert "." in registry, image  # a registry host, not a bare name that only a local Docker knows
    name, tag = rest.rsplit(":", 1)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert tag != "latest" and tag.startswith(chart["appVersion"]), image
    assert tag.endswith("-gpu") == variant.startswith("gpu"), image


def test_image_latest_and_missing_registry_are_refused():
    assert "latest is refused" in render_error(merged(BASE, {"image": {"tag": "latest"}}))
    assert "image.registry is required" in render_error(merged(BASE, {"image": {"registry": ""}}))
    digest = "sha256:" + "0" * 64
    [deployment] = [d for d in render(merged(BASE, {"image": {"digest": digest}})) if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@" + digest)


def test_api_keys_secret_is_required_and_not_optional(rendered):
    message = render_error(merged(BASE, {"apiKeys": {"existingSecret": ""}}))
    assert "apiKeys.existingSecret is required" in message
    docs = rendered["cpu"]
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    secret = volumes["api-keys"]["secret"]
    assert secret["secretName"] == "nmt-serve-keys" and secret["optional"] is False
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    key_file = env(docs)["NMT_API_KEYS_FILE"]["value"]
    assert key_file == f"{mounts['api-keys']}/{secret['items'][0]['path']}"
    # switched off on purpose: no keys at all, and nothing half-wired
    assert not {"NMT_API_KEYS", "NMT_API_KEYS_FILE"} & set(env(rendered["no-keys"]))
    # no variant takes a key from a Secret marked optional
    for docs in rendered.values():
        for e in container(docs)["env"]:
            assert not e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional")


def test_settings_the_chart_owns_cannot_be_overridden():
    assert "settings.api_keys is set by the chart" in render_error(merged(BASE, {"settings": {"api_keys": "x"}}))
    assert "settings.threads is set by the chart" in render_error(merged(BASE, {"settings": {"threads": 4}}))


# --------------------------------------------------------------------------------------------- jobs and replicas


def jobs_volume(docs) -> tuple[str | None, dict | None]:
    """Where the pods mount the volume named `jobs`, and that volume (None, None: no such volume)."""
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    if "jobs" not in volumes:
        assert "jobs" not in mounts
        return None, None
    return mounts["jobs"]["mountPath"], volumes["jobs"]


def test_the_default_is_one_replica_with_its_jobs_in_the_pods_emptydir(rendered, monkeypatch):
    """One pod: the jobs stay where they were, in the service's default jobs_dir under /tmp, the emptyDir."""
    import tempfile

    from nmt_serve.service.jobs_store import default_directory

    # the service's default with no NMT_JOBS_DIR: the temporary directory, /tmp in the pod (no TMPDIR set)
    assert Settings.model_fields["jobs_dir"].default == ""
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("TEMP", raising=False)
    monkeypatch.delenv("TMP", raising=False)
    assert default_directory().parent.as_posix() == "/tmp"
    for variant in ("cpu", "gpu-no-autoscaling", "no-keys", "models-volume"):
        docs = rendered[variant]
        assert kinds(docs)["Deployment"]["spec"]["replicas"] == 1, variant
        variables = env(docs)
        assert "NMT_JOBS_DIR" not in variables and "NMT_SYNC_FILE_CHARS" not in variables, variant
        assert jobs_volume(docs) == (None, None), variant
        assert not {"TMPDIR", "TEMP", "TMP"} & set(variables), variant
        mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
        assert "emptyDir" in {v["name"]: v for v in pod_spec(docs)["volumes"]}[mounts["/tmp"]]
    # replicaCount 1 said outright: the same
    docs = render(merged(BASE, {"replicaCount": 1}))
    assert jobs_volume(docs) == (None, None) and "NMT_JOBS_DIR" not in env(docs)


@pytest.mark.parametrize("values", [
    {"replicaCount": 2},
    {"replicaCount": 3, "jobs": {"existingClaim": ""}},
    {"autoscaling": {"enabled": True}},
    {"autoscaling": {"enabled": True, "mode": "keda"}},
    {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}},
    {"replicaCount": 5, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3}},
], ids=["two", "three-empty-claim", "hpa", "keda", "hpa-max-2", "hpa-over-replicacount"])
def test_more_than_one_replica_without_a_shared_jobs_volume_is_refused(values):
    """Each pod's emptyDir would hold its own jobs: a job made on one pod, polled on another, is 404."""
    message = render_error(merged(BASE, values))
    assert REFUSED_WITHOUT_CLAIM in message, message
    assert "ReadWriteMany" in message and "replicaCount=1" in message


def test_the_gpu_values_file_needs_the_shared_claim_for_its_autoscaling():
    gpu = merged(BASE, yaml.safe_load(GPU_VALUES.read_text()))
    assert REFUSED_WITHOUT_CLAIM in render_error(gpu)
    assert "autoscaling.maxReplicas=" in render_error(gpu)


def test_an_autoscaler_that_never_goes_past_one_pod_needs_no_claim():
    docs = render(merged(BASE, {"replicaCount": 4, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 1}}))
    assert "replicas" not in kinds(docs)["Deployment"]["spec"]  # the autoscaler's, not replicaCount's 4
    assert jobs_volume(docs) == (None, None)


@pytest.mark.parametrize("variant", ["cpu-two-replicas", "cpu-autoscaling", "keda", "gpu"])
def test_every_replica_mounts_the_same_claim_where_the_service_keeps_its_jobs(rendered, variant):
    docs = rendered[variant]
    deployment = kinds(docs)["Deployment"]
    if variant == "cpu-two-replicas":
        assert deployment["spec"]["replicas"] == 2
    # one pod template for every replica: each pod mounts the one claim, read-write
    path, volume = jobs_volume(docs)
    assert volume == {"name": "jobs", "persistentVolumeClaim": {"claimName": "nmt-jobs"}}
    [mount] = [m for m in container(docs)["volumeMounts"] if m["name"] == "jobs"]
    assert not mount.get("readOnly") and "subPath" not in mount
    # ... where the service keeps its jobs (the setting JobStore is made from: app.py, jobs_dir)
    variables = env(docs)
    settings = Settings(**{k[4:].lower(): e["value"] for k, e in variables.items() if k.startswith("NMT_") and "value" in e})
    assert settings.jobs_dir == path == "/jobs"
    assert not path.startswith("/tmp")  # not inside the per-pod emptyDir, which stays for the engine's sockets
    # files translated within the request are kept under jobs_dir too (routers/libretranslate.file_store):
    # nothing needs turning them into jobs
    assert "NMT_SYNC_FILE_CHARS" not in variables


def test_one_replica_with_a_claim_keeps_its_jobs_there():
    docs = render(merged(BASE, SHARED_JOBS))
    assert kinds(docs)["Deployment"]["spec"]["replicas"] == 1
    assert jobs_volume(docs)[0] == env(docs)["NMT_JOBS_DIR"]["value"] == "/jobs"
    assert "NMT_SYNC_FILE_CHARS" not in env(docs)


def test_a_sync_file_chars_of_ones_own_is_passed_on_and_jobs_dir_belongs_to_the_chart():
    docs = render(merged(BASE, {"replicaCount": 2, "settings": {"sync_file_chars": 5000}}, SHARED_JOBS))
    assert [e["value"] for e in container(docs)["env"] if e["name"] == "NMT_SYNC_FILE_CHARS"] == ["5000"]
    assert "settings.jobs_dir is set by the chart" in render_error(merged(BASE, {"settings": {"jobs_dir": "/tmp/j"}}))
    docs = render(merged(BASE, {"replicaCount": 2, "jobs": {"existingClaim": "nmt-jobs", "mountPath": "/var/lib/nmt/jobs"}}))
    assert jobs_volume(docs)[0] == env(docs)["NMT_JOBS_DIR"]["value"] == "/var/lib/nmt/jobs"


@pytest.mark.parametrize("path", ["/tmp", "/tmp/jobs", "/models", "/", "jobs"])
def test_the_jobs_mount_path_is_refused_where_it_would_clash(path):
    message = render_error(merged(BASE, {"replicaCount": 2, "jobs": {"existingClaim": "nmt-jobs", "mountPath": path}}))
    assert "jobs.mountPath" in message


def test_notes_say_where_the_jobs_are():
    def notes(values):
        with helm.Chart.load(str(CHART)) as chart:
            return chart.render(values, name="nmt", namespace="translation")["nmt-serve/templates/NOTES.txt"]

    assert "emptyDir" in notes(BASE)
    assert "nmt-jobs" in notes(merged(BASE, {"replicaCount": 2}, SHARED_JOBS))


def test_graceful_stop(rendered):
    for docs in rendered.values():
        c = container(docs)
        sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        graceful = float(env(docs)["NMT_GRACEFUL_SHUTDOWN_S"]["value"])
        assert sleep > 0
        assert pod_spec(docs)["terminationGracePeriodSeconds"] > sleep + graceful
        strategy = kinds(docs)["Deployment"]["spec"]["strategy"]["rollingUpdate"]
        assert strategy["maxUnavailable"] == 0


def test_disruption_budget_and_network_policy(rendered):
    docs = rendered["cpu"]
    objects = kinds(docs)
    selector = objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert "maxUnavailable" in objects["PodDisruptionBudget"]["spec"]  # minAvailable 1 would block drains at 1 replica
    policy = objects["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == selector
    assert [p["port"] for rule in policy["ingress"] for p in rule["ports"]] == ["http"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    spread = pod_spec(docs)["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert all(s["labelSelector"]["matchLabels"] == selector for s in spread)


# --------------------------------------------------------------------------------------------- agrees with the service


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_probes_point_at_the_health_endpoints(rendered, variant):
    c = container(rendered[variant])
    paths = app_paths()
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] in paths
        assert c[probe]["httpGet"]["port"] == "http"
        assert 1 <= c[probe]["timeoutSeconds"] < c[probe]["periodSeconds"] + 1


def test_ports_agree(rendered):
    for name, docs in rendered.items():
        objects = kinds(docs)
        c = container(docs)
        [port] = [p for p in c["ports"] if p["name"] == "http"]
        assert port["containerPort"] == int(env(docs)["NMT_PORT"]["value"]) == Settings().port
        service = objects["Service"]
        assert service["spec"]["ports"][0]["targetPort"] == "http"
        assert service["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
        # one scrape path: annotations on the pod or a ServiceMonitor, never both, never on the Service
        assert not any(k.startswith("prometheus.io/") for k in service["metadata"].get("annotations", {}))
        annotations = objects["Deployment"]["spec"]["template"]["metadata"].get("annotations", {})
        if "ServiceMonitor" in objects:
            assert not any(k.startswith("prometheus.io/") for k in annotations), name
            [endpoint] = objects["ServiceMonitor"]["spec"]["endpoints"]
            assert endpoint["port"] == "http" and endpoint["path"] in app_paths()
        else:
            assert annotations["prometheus.io/port"] == str(port["containerPort"])
            assert annotations["prometheus.io/path"] in app_paths()


def test_metrics_token_from_a_secret(rendered):
    docs = rendered["servicemonitor-token"]
    ref = env(docs)["NMT_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "nmt-serve-metrics"
    [endpoint] = kinds(docs)["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["bearerTokenSecret"] == {"name": ref["name"], "key": ref["key"]}
    assert "NMT_METRICS_TOKEN" not in env(rendered["cpu"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_env_names_are_real_settings(rendered, variant):
    docs = rendered[variant]
    fields = {f"NMT_{name.upper()}" for name in Settings.model_fields}
    variables = {name: e for name, e in env(docs).items() if name.startswith("NMT_")}  # HOME and caches aside
    for name in variables:
        assert name in fields, f"{name} is not a setting"
    # the values parse as the settings they name
    Settings(**{name[4:].lower(): e["value"] for name, e in variables.items() if "value" in e})
    # the pod's CPU limit, which must exist, sizes the engine: on a GPU its torch threads; on a CPU its lanes of
    # one thread each, which the engine reads from its cgroup (threads from the limit as well: limit x limit threads)
    if variant.startswith("gpu"):
        assert variables["NMT_THREADS"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
        assert variables["NMT_ENGINES"]["value"] == "1"  # two on one GPU not measured yet
    else:
        assert "NMT_THREADS" not in variables and "NMT_LANES" not in variables
        assert variables["NMT_ENGINES"]["value"] == "2"  # two engines of one lane: measured faster on 2 cores
    assert "cpu" in container(docs)["resources"]["limits"]
    if "models" in {v["name"] for v in pod_spec(docs)["volumes"]}:
        assert variables["NMT_MODELS_DIR"]["value"] == "/models"


def test_gpu_scheduling(rendered):
    for name, docs in rendered.items():
        spec, c = pod_spec(docs), container(docs)
        if name.startswith("gpu"):
            assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            assert env(docs)["NMT_DEVICE"]["value"] == "cuda"
        else:
            assert "nvidia.com/gpu" not in c["resources"]["limits"]
            assert not spec.get("nodeSelector") and not spec.get("tolerations")
            assert env(docs)["NMT_DEVICE"]["value"] == "cpu"


def test_replicas_belong_to_the_autoscaler(rendered):
    for name, docs in rendered.items():
        objects = kinds(docs)
        scaled = "HorizontalPodAutoscaler" in objects or "ScaledObject" in objects
        assert ("replicas" not in objects["Deployment"]["spec"]) == scaled, name
        assert scaled == (name in {"gpu", "cpu-autoscaling", "keda"}), name
        if not scaled:
            assert objects["Deployment"]["spec"]["replicas"] == (2 if name == "cpu-two-replicas" else 1), name


def test_autoscaler_scales_on_a_metric_the_service_exposes(rendered):
    hpa = kinds(rendered["cpu-autoscaling"])["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == kinds(rendered["cpu-autoscaling"])["Deployment"]["metadata"]["name"]
    assert hpa["minReplicas"] <= hpa["maxReplicas"]
    [metric] = hpa["metrics"]
    assert metric["type"] == "Pods"  # not CPU: a batching server is busy as soon as one batch runs
    # the prometheus-adapter rule makes that metric, from series the service really exports
    [rule] = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    exposed = exposed_engine_metrics()
    used = set(re.findall(r"\bnmt_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
    assert used and used <= exposed, used - exposed
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    # KEDA: the same backlog, straight from Prometheus, never from zero replicas
    keda = kinds(rendered["keda"])["ScaledObject"]["spec"]
    assert keda["scaleTargetRef"]["name"] == kinds(rendered["keda"])["Deployment"]["metadata"]["name"]
    assert keda["minReplicaCount"] >= 1
    [trigger] = keda["triggers"]
    assert trigger["type"] == "prometheus"
    used = set(re.findall(r"\bnmt_[a-z_]+", trigger["metadata"]["query"]))
    assert used and used <= exposed, used - exposed
    assert 'namespace="translation"' in trigger["metadata"]["query"]


def exported_metrics() -> set[str]:
    """Every series name /metrics can carry: the app's own metrics and the engine collector's (counters with _total)."""
    from nmt_serve.service.metrics import Metrics

    from nmt_serve.service.metrics import ENGINE_COUNTERS

    engine = EngineCollector()  # with every statistic an engine publishes
    engine.stats = {key: 1.0 for key in [*ENGINE_COUNTERS, *ENGINE_GAUGES]}
    names = set()
    for family in [*Metrics().registry.collect(), *engine.collect()]:
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def series_named(expr: str) -> set[str]:
    return set(re.findall(r"\bnmt_[a-z_]+", expr))


def test_alerts_are_valid_promql_on_series_the_service_exports(rendered):
    """metrics.alerts: a PrometheusRule whose expressions parse as PromQL, select this release's pods, and name only
    series /metrics carries; none by default; refused without the Prometheus Operator's scrape (its labels)."""
    promql = pytest.importorskip("promql_parser")
    assert "PrometheusRule" not in kinds(rendered["cpu"])
    rule = kinds(rendered["alerts"])["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    [group] = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {"NmtNoEngineReady", "NmtEngineStalled", "NmtEngineRestarting", "NmtServerErrors"}
    exported = exported_metrics()
    for name, r in alerts.items():
        promql.parse(r["expr"])  # ValueError if not PromQL
        used = series_named(r["expr"])
        assert used and used <= exported, (name, used - exported)
        assert r["expr"].count('namespace="translation", pod=~"nmt-nmt-serve-.*"') == r["expr"].count("nmt_")
        assert r["labels"]["severity"] in {"warning", "critical"} and r["annotations"]["summary"]
    assert "metrics.alerts.enabled needs metrics.scrape=serviceMonitor" in render_error(merged(BASE, {"metrics": {"alerts": {"enabled": True}}}))
    with pytest.raises(ValueError):  # the parser does reject what is not PromQL
        promql.parse("max by (pod) (nmt_engine_up == 0")


def test_the_dashboard_reads_series_the_service_exports(rendered):
    """metrics.dashboard: a ConfigMap for Grafana's dashboard sidecar whose every panel's query parses as PromQL and
    names only series /metrics carries; none by default."""
    import json

    promql = pytest.importorskip("promql_parser")
    assert "ConfigMap" not in kinds(rendered["cpu"])
    config_map = kinds(rendered["dashboard"])["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["nmt-serve.json"])
    exported = exported_metrics()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= len(dashboard["panels"]) >= 10
    for expr in exprs:  # Grafana's variables stand in a label's value
        promql.parse(expr.replace("$namespace", "translation").replace("$pod", ".*"))
        assert series_named(expr) and series_named(expr) <= exported, (expr, series_named(expr) - exported)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "pod"} <= set(variables)
    for name in ("namespace", "pod"):
        assert series_named(variables[name]["query"]["query"]) <= exported
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)


def test_dockerfile_matches_the_service():
    text = (ROOT / "Dockerfile").read_text()
    assert "EXPOSE 8000" in text and "/health/ready" in text and "USER app" in text
    for line in text.splitlines():
        for token in line.replace("\\", " ").split():
            if token.startswith("NMT_") and "=" in token:
                name = token.split("=")[0]
                assert name[4:].lower() in Settings.model_fields, name
