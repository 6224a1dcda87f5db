"""The Helm chart's pods hold no Kubernetes API token they do not need, the bundled PostgreSQL answers the control plane
only, and Ray pods connect only where they must (docs/security.md, "The chart's pods: tokens and network").

Code on the Ray cluster (users' uploads included) runs in the Ray pods. Before: they mounted the namespace's
default ServiceAccount token (whatever RBAC that account has, code on the cluster had), nothing kept them (or any
other pod) from the bundled PostgreSQL, and they could open connections anywhere. Now:

- every Ray pod has ``automountServiceAccountToken: false``; with KubeRay's autoscaler on, the head pod gets a
  projected token mounted into the autoscaler's container only (it scales the RayCluster through the API); the
  control plane and its migration Job mount none either (they need no API);
- a NetworkPolicy lets only the control plane and its migration Job (and ``networkPolicy.postgresqlFrom``)
  reach the bundled PostgreSQL, on 5432;
- a NetworkPolicy limits the Ray pods' egress to their own cluster's pods, the control plane's API port, DNS,
  the object store of ``storage.uri`` (port 443) and, for the autoscaler, the Kubernetes API; each is a value
  (``networkPolicy.rayEgress``), with ``extra`` rules for more.

Rendered with Helm's own SDK (``tests/unit/test_deploy_chart.py``'s helpers); every rendered manifest is also
checked by ``kubernetes-validate --strict`` there.
"""

from __future__ import annotations

import pytest

from tests.unit import test_deploy_chart as chart

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
CLUSTER = f"{chart.RELEASE}-orchestrator-ray"


def policy(objects: list[dict], name: str) -> dict:
    return chart.one(objects, "NetworkPolicy", f"{chart.RELEASE}-orchestrator-{name}")


def pod_template_labels(objects: list[dict], kind: str) -> dict[str, str]:
    return chart.one(objects, kind)["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("values_name", chart.VALUES_FILES)
def test_no_pod_mounts_a_service_account_token_but_the_autoscalers_container(values_name):
    """On the old chart: ``KeyError: 'automountServiceAccountToken'`` on the Ray head's pod template (the token
    of the namespace's default ServiceAccount was mounted into every Ray container)."""
    values = chart.values_file(values_name)
    objects = chart.render(values)
    cluster = chart.one(objects, "RayCluster")
    for group, template in chart.ray_pod_templates(cluster):
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, group
        for container in spec["containers"]:
            mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert TOKEN_PATH not in mounts, (group, container["name"])
    for kind in ("Deployment", "Job"):
        assert chart.one(objects, kind)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, kind

    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    token_volumes = [v for v in head["volumes"] if "projected" in v]
    if not values.get("ray", {}).get("autoscaling", {}).get("enabled"):
        assert not token_volumes and "autoscalerOptions" not in cluster["spec"]
        return
    # The autoscaler patches the RayCluster through the API: its container alone gets a token, where the
    # in-cluster client looks for it.
    [volume] = token_volumes
    sources = volume["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}} in sources
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
    mounts = cluster["spec"]["autoscalerOptions"]["volumeMounts"]
    assert mounts == [{"name": volume["name"], "mountPath": TOKEN_PATH, "readOnly": True}]


def test_only_the_control_plane_and_its_migrations_reach_the_bundled_postgresql():
    """On the old chart: ``AssertionError: expected one NetworkPolicy demo-orchestrator-postgresql, found []``."""
    values = chart.values_file("gpu-postgresql-values.yaml")
    objects = chart.render(values)
    guard = policy(objects, "postgresql")
    database = pod_template_labels(objects, "StatefulSet")
    assert guard["spec"]["podSelector"]["matchLabels"].items() <= database.items()
    assert guard["spec"]["policyTypes"] == ["Ingress"]
    [rule] = guard["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 5432}]
    peers = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert peers == [pod_template_labels(objects, "Deployment"), pod_template_labels(objects, "Job")]
    for _, template in chart.ray_pod_templates(chart.one(objects, "RayCluster")):
        assert not any(peer.items() <= template["metadata"]["labels"].items() for peer in peers)
    # More peers are a value (a backup job); no bundled PostgreSQL or no NetworkPolicies: no policy.
    backup = {"podSelector": {"matchLabels": {"app": "pg-backup"}}}
    widened = chart.render(values | {"networkPolicy": {"enabled": True, "postgresqlFrom": [backup]}})
    assert policy(widened, "postgresql")["spec"]["ingress"][0]["from"][-1] == backup
    external = chart.render(chart.values_file("external-db-values.yaml"))
    assert not [o for o in external if o["metadata"]["name"].endswith("-postgresql")]
    off = chart.render(values | {"networkPolicy": {"enabled": False}})
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


def egress_rules(objects: list[dict]) -> list[dict]:
    fence = policy(objects, "ray-egress")
    assert fence["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": CLUSTER}}
    assert fence["spec"]["policyTypes"] == ["Egress"]
    return fence["spec"]["egress"]


DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def test_ray_pods_connect_only_to_their_cluster_the_control_plane_dns_and_storage():
    """On the old chart: ``AssertionError: expected one NetworkPolicy demo-orchestrator-ray-egress, found []``
    (Ray pods could connect anywhere: other namespaces, the database, the cloud's metadata service)."""
    objects = chart.render(chart.values_file("external-db-values.yaml"))  # storage on a shared volume
    api_port = chart.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert egress_rules(objects) == [
        {"to": [{"podSelector": {"matchLabels": {"ray.io/cluster": CLUSTER}}}]},  # Ray's own traffic: every port
        {
            "to": [{"podSelector": {"matchLabels": pod_template_labels(objects, "Deployment")}}],
            "ports": [{"protocol": "TCP", "port": api_port["containerPort"]}],
        },
        {"to": [DNS_PEER], "ports": DNS_PORTS},
    ]  # a volume's traffic is the node's (the kubelet mounts it), not the pod's: no rule for it

    # An object store: port 443, anywhere by default, or the peers given.
    store = chart.render(chart.values_file("object-store-existing-secret-values.yaml"))
    assert egress_rules(store)[3] == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    bucket = {"ipBlock": {"cidr": "198.51.100.0/24"}}
    narrowed = chart.values_file("object-store-existing-secret-values.yaml") | {
        "networkPolicy": {
            "enabled": True,
            "rayEgress": {
                "enabled": True,
                "dns": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
                "storage": [bucket],
                "storagePorts": [9000],
                "extra": [
                    {"to": [{"ipBlock": {"cidr": "203.0.113.5/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
                ],
            },
        }
    }
    rules = egress_rules(chart.render(narrowed))
    assert rules[2] == {"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}], "ports": DNS_PORTS}
    assert rules[3] == {"to": [bucket], "ports": [{"protocol": "TCP", "port": 9000}]}
    assert rules[-1]["to"] == [{"ipBlock": {"cidr": "203.0.113.5/32"}}]
    # Turned off, Ray pods may connect anywhere (as before); the ingress policy stays.
    loose = chart.render(
        chart.values_file("external-db-values.yaml")
        | {"networkPolicy": {"enabled": True, "rayEgress": {"enabled": False}}}
    )
    assert [o["metadata"]["name"] for o in loose if o["kind"] == "NetworkPolicy"] == [
        f"{chart.RELEASE}-orchestrator-ray"
    ]


def test_with_the_autoscaler_only_the_head_may_reach_the_kubernetes_api():
    """On the old chart there was no egress policy at all (the same failure as above)."""
    objects = chart.render(chart.values_file("gpu-postgresql-values.yaml"))  # autoscaling on
    head_labels = chart.one(objects, "RayCluster")["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    api = policy(objects, "ray-autoscaler")
    assert api["spec"]["podSelector"]["matchLabels"].items() <= head_labels.items()
    assert api["spec"]["policyTypes"] == ["Egress"]
    assert api["spec"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
        }
    ]
    without = chart.render(chart.values_file("external-db-values.yaml"))
    assert not [o for o in without if o["metadata"]["name"].endswith("-ray-autoscaler")]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("networkPolicy:\n  enabled: true\n  rayEgress:\n    enabled: 'yes'\n", "/networkPolicy/rayEgress/enabled"),
        (
            "networkPolicy:\n  enabled: true\n  rayEgress:\n    storagePorts: [0]\n",
            "/networkPolicy/rayEgress/storagePorts/0",
        ),
        ("networkPolicy:\n  enabled: true\n  postgresqlFrom: {}\n", "/networkPolicy/postgresqlFrom"),
    ],
)
def test_the_new_values_are_checked_by_the_schema(text, where, tmp_path):
    values = chart.helm.values_from_yaml(
        "postgresql:\n  enabled: false\ndatabase:\n  url: postgresql+psycopg://u:p@db:5432/o\n" + text
    )
    with chart.helm.Chart.load(chart.CHART) as loaded, pytest.raises(chart.helm.HelmValuesError) as caught:
        loaded.validate_schema(values)
    assert where in str(caught.value), str(caught.value)
