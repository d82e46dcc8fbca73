"""The chart renders, lints and validates in every switch, with safe defaults, and everything it
passes to the sidecar is a setting the sidecar knows and accepts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sidecar import config
from sidecar.backends.zookeeper.target import parse_target
from tests.chart.helm import (
    KUBE_VERSIONS,
    Helm,
    HelmError,
    Manifest,
    containers,
    find,
    one,
    pod_spec,
    sidecar,
    validate,
)
from tests.chart.switches import ETCD_TLS, SWITCHES

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def example(manifests: list[Manifest]) -> Manifest:
    return one(manifests, "Deployment", "demo-leader-sidecar-example")


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the sidecar would see it: Downward API and Secret values
    replaced by plausible ones, and ``$(NAME)`` of a variable listed earlier replaced by its
    value, as the kubelet does."""
    fake = {
        "metadata.name": "demo-leader-sidecar-example-7d9c-x2x4q",
        "metadata.namespace": "apps",
        "status.podIP": "10.0.1.7",
        "metadata.labels['pod-template-hash']": "7d9c",
    }
    environ: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            environ[var["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: environ.get(m[1], m[0]),
                str(var["value"]),
            )
        elif "fieldRef" in var["valueFrom"]:
            environ[var["name"]] = fake[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            environ[var["name"]] = "from-a-secret"
    return environ


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_helm_lint_strict_passes(helm: Helm, switch: str) -> None:
    """``helm lint --strict`` (warnings are errors) with each switch's values."""
    output = helm.lint(values=SWITCHES[switch])
    assert "1 chart(s) linted, 0 chart(s) failed" in output
    assert "[WARNING]" not in output
    assert "[ERROR]" not in output


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_every_rendered_manifest_validates_strictly(
    helm: Helm, switch: str, kube_version: str
) -> None:
    """``kubernetes-validate --strict`` accepts every built-in object; the only kinds without a
    schema are the prometheus-operator ones (checked in test_monitoring.py)."""
    manifests = helm.template(values=SWITCHES[switch], kube_version=kube_version)
    assert manifests, "nothing rendered"
    unvalidated = validate(manifests, kube_version)
    assert set(unvalidated) <= MONITORING_KINDS
    assert len(unvalidated) == len([m for m in manifests if m["kind"] in MONITORING_KINDS])


def test_the_defaults_render_the_rbac_and_the_leader_service_and_no_pods(helm: Helm) -> None:
    """On its own, without the example, `helm install` creates what a plain Deployment needs
    next to it (the `helm test` objects are created by `helm test` only)."""
    manifests = helm.template(extra=["--skip-tests"])
    assert sorted(m["kind"] for m in manifests) == [
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]


def test_the_example_runs_three_replicas_each_with_the_app_and_the_sidecar(helm: Helm) -> None:
    manifests = helm.template(values=SWITCHES["example"])
    deployment = example(manifests)
    assert deployment["spec"]["replicas"] == 3
    assert [(field, c["name"]) for field, c in containers(deployment)] == [
        ("containers", "app"),
        ("containers", "leader-sidecar"),
    ]
    spec = pod_spec(deployment)
    assert spec["serviceAccountName"] == one(manifests, "ServiceAccount")["metadata"]["name"]
    # Long enough for the sidecar's release (within 2 s of SIGTERM), short enough for rollouts.
    assert 3 <= spec["terminationGracePeriodSeconds"] <= 30


def test_the_sidecar_defaults_are_safe(helm: Helm) -> None:
    """Non-root, read-only root, no capabilities, resource requests, the app API on loopback."""
    container = sidecar(example(helm.template(values=SWITCHES["example"])))
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert isinstance(security["runAsUser"], int)
    assert security["runAsUser"] > 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    env = environment(container)
    assert env["LEADER_SIDECAR_LISTEN"] == "127.0.0.1:4040"
    assert env["LEADER_SIDECAR_PUBLIC_LISTEN"] == "0.0.0.0:4041"
    # Only the public port is declared: the app API is not meant to be reachable from outside.
    assert container["ports"] == [
        {"name": "sidecar-public", "containerPort": 4041, "protocol": "TCP"}
    ]


def test_probes_use_the_public_port_and_never_leadership(helm: Helm) -> None:
    """Followers must be live and ready too, or a rolling update would stall on them."""
    container = sidecar(example(helm.template(values=SWITCHES["example"])))
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http = container[probe]["httpGet"]
        assert http["port"] == "sidecar-public"
        paths[probe] = http["path"]
    assert paths == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }


def downward(container: dict[str, Any]) -> dict[str, str]:
    return {
        var["name"]: var["valueFrom"]["fieldRef"]["fieldPath"]
        for var in container["env"]
        if "fieldRef" in var.get("valueFrom", {})
    }


def test_pod_name_namespace_and_revision_come_from_the_downward_api(helm: Helm) -> None:
    """The revision is the Deployment's pod-template-hash label: new pods of a rollout differ.
    POD_IP is the one address besides loopback --app-health-url may name."""
    container = sidecar(example(helm.template(values=SWITCHES["example"])))
    assert downward(container) == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
        "LEADER_SIDECAR_REVISION": "metadata.labels['pod-template-hash']",
    }


def test_the_revision_label_can_be_a_statefulsets_or_none(helm: Helm) -> None:
    for label, expected in (
        ("controller-revision-hash", "metadata.labels['controller-revision-hash']"),
        ("", None),
    ):
        values = {**SWITCHES["example"], "revisionLabel": label}
        container = sidecar(example(helm.template(values=values)))
        assert downward(container).get("LEADER_SIDECAR_REVISION") == expected


def test_native_sidecar_is_an_init_container_that_always_restarts(helm: Helm) -> None:
    """Starts (and passes its startup probe) before the app, stops after it."""
    deployment = example(helm.template(values=SWITCHES["native-sidecar"]))
    placed = [(field, c["name"]) for field, c in containers(deployment)]
    assert placed == [("initContainers", "leader-sidecar"), ("containers", "app")]
    container = sidecar(deployment)
    assert container["restartPolicy"] == "Always"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_native_sidecar_is_refused_before_kubernetes_1_29(helm: Helm) -> None:
    with pytest.raises(HelmError, match=r"nativeSidecar=true needs Kubernetes 1\.29"):
        helm.template(values=SWITCHES["native-sidecar"], kube_version="1.28.0")
    # The regular container works there.
    assert sidecar(example(helm.template(values=SWITCHES["example"], kube_version="1.28.0")))


@pytest.fixture(scope="module")
def postgresql_tls(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory holding the CA the postgresql switch's URL names, as its Secret would."""
    from tests.redis.servers import TlsFiles

    files = TlsFiles.make(tmp_path_factory.mktemp("pg-chart-tls"), "chart")
    (files.directory / "ca.crt").write_bytes(files.ca_cert.read_bytes())
    return str(files.directory)


@pytest.mark.parametrize("switch", sorted(set(SWITCHES) - {"defaults"}))
def test_every_variable_the_chart_sets_is_a_setting_the_sidecar_accepts(
    helm: Helm, switch: str, postgresql_tls: str
) -> None:
    """The sidecar refuses unknown LEADER_SIDECAR_* variables at start; here each one the chart
    sets is known and its value parses as the sidecar parses it."""
    manifests = helm.template(values=SWITCHES[switch])
    env = environment(sidecar(example(manifests)))
    by_env = {option.env: option for option in config.OPTIONS}
    ours = {name: value for name, value in env.items() if name.startswith(config.ENV_PREFIX)}
    assert set(ours) <= set(by_env), set(ours) - set(by_env)
    for name, value in ours.items():
        if name == "LEADER_SIDECAR_STORE" and value.startswith("sqlite:"):
            # parse_store checks that the directory exists, which it does in the pod only.
            assert value == "sqlite:////var/lib/leader-sidecar/leader-sidecar.db"
            continue
        if name == "LEADER_SIDECAR_STORE" and value.startswith("postgresql:"):
            # parse_store loads the TLS files the URL names, which exist in the pod only.
            value = value.replace("/etc/leader-sidecar/postgresql-tls/", f"{postgresql_tls}/")
        by_env[name].parse(value)  # raises ValueError with the sidecar's own message


@pytest.mark.parametrize(
    "switch", ["example", "redis", "redis-sentinel", "timing-and-identity", "zookeeper-digest"]
)
def test_the_sidecar_builds_its_configuration_from_the_rendered_environment(
    helm: Helm, switch: str
) -> None:
    """The whole environment, cross-field checks included (timing, ports), passes
    ``config.load`` — the same code the container runs at start."""
    env = environment(sidecar(example(helm.template(values=SWITCHES[switch]))))
    loaded = config.load([], {**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert loaded.lease == env["LEADER_SIDECAR_LEASE"]
    assert loaded.store == env["LEADER_SIDECAR_STORE"]
    assert loaded.identity.startswith(env.get("LEADER_SIDECAR_IDENTITY", env["POD_NAME"]) + "_")
    assert loaded.namespace == "apps"


def test_values_reach_every_flag_of_the_sidecar(helm: Helm) -> None:
    """ "Values for everything the CLI offers": across the switches, every option of
    sidecar/config.py is set by some value. --pod-name is the one exception: the sidecar reads
    POD_NAME, which the Downward API sets in every variant."""
    seen: set[str] = set()
    for values in SWITCHES.values():
        for workload in find(helm.template(values=values), "Deployment"):
            seen |= set(environment(sidecar(workload)))
    assert "POD_NAME" in seen
    expected = {option.env for option in config.OPTIONS} - {"LEADER_SIDECAR_POD_NAME"}
    assert expected - seen == set()


def test_timing_and_listeners_map_to_their_variables(helm: Helm) -> None:
    env = environment(sidecar(example(helm.template(values=SWITCHES["timing-and-identity"]))))
    assert {k: v for k, v in env.items() if k.startswith("LEADER_SIDECAR_")} == {
        "LEADER_SIDECAR_STORE": "kubernetes",
        "LEADER_SIDECAR_LEASE": "demo-leader-sidecar",
        "LEADER_SIDECAR_LEASE_DURATION": "10s",
        "LEADER_SIDECAR_RENEW_INTERVAL": "3",
        "LEADER_SIDECAR_RETRY_PERIOD": "1500ms",
        "LEADER_SIDECAR_REQUEST_TIMEOUT": "1s",
        "LEADER_SIDECAR_IDENTITY": "payments",
        "LEADER_SIDECAR_LISTEN": "127.0.0.1:5050",
        "LEADER_SIDECAR_PUBLIC_LISTEN": "[::]:5051",
        "LEADER_SIDECAR_LOG_FORMAT": "text",
        "LEADER_SIDECAR_LOG_LEVEL": "debug",
        "LEADER_SIDECAR_ROLE_LABEL_KEY": "leader-sidecar/role",
        "LEADER_SIDECAR_REVISION": "7d9c",
    }


def test_the_redis_password_comes_from_the_secret_and_tls_files_from_a_mounted_secret(
    helm: Helm,
) -> None:
    deployment = example(helm.template(values=SWITCHES["redis-tls"]))
    container = sidecar(deployment)
    password = next(v for v in container["env"] if v["name"] == "LEADER_SIDECAR_REDIS_PASSWORD")
    assert password == {
        "name": "LEADER_SIDECAR_REDIS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "password"}},
    }
    env = environment(container)
    assert env["LEADER_SIDECAR_REDIS_CA_FILE"] == "/etc/leader-sidecar/redis-tls/ca.crt"
    assert env["LEADER_SIDECAR_REDIS_CERT_FILE"] == "/etc/leader-sidecar/redis-tls/tls.crt"
    assert env["LEADER_SIDECAR_REDIS_KEY_FILE"] == "/etc/leader-sidecar/redis-tls/tls.key"
    assert env["LEADER_SIDECAR_REDIS_MIN_REPLICAS"] == "1"
    assert container["volumeMounts"] == [
        {
            "name": "leader-sidecar-redis-tls",
            "mountPath": "/etc/leader-sidecar/redis-tls",
            "readOnly": True,
        }
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-redis-tls",
            "secret": {"secretName": "redis-tls", "defaultMode": 0o444},
        }
    ]


def test_the_postgresql_password_comes_from_the_secret_and_tls_files_from_a_mounted_secret(
    helm: Helm,
) -> None:
    deployment = example(helm.template(values=SWITCHES["postgresql"]))
    container = sidecar(deployment)
    password = next(v for v in container["env"] if v["name"] == "PGPASSWORD")
    assert password == {
        "name": "PGPASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "db-auth", "key": "password"}},
    }
    assert environment(container)["LEADER_SIDECAR_STORE"].startswith(
        "postgresql://sidecar@db-0.data:5432,db-1.data:5432/app?"
    )
    assert container["volumeMounts"] == [
        {
            "name": "leader-sidecar-postgresql-tls",
            "mountPath": "/etc/leader-sidecar/postgresql-tls",
            "readOnly": True,
        }
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-postgresql-tls",
            "secret": {"secretName": "db-tls", "defaultMode": 0o400},
        }
    ]


def test_the_etcd_password_comes_from_the_secret_and_tls_files_from_a_mounted_secret(
    helm: Helm,
) -> None:
    deployment = example(helm.template(values=SWITCHES["etcd-tls"]))
    container = sidecar(deployment)
    password = next(v for v in container["env"] if v["name"] == "LEADER_SIDECAR_ETCD_PASSWORD")
    assert password == {
        "name": "LEADER_SIDECAR_ETCD_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "etcd-auth", "key": "password"}},
    }
    env = environment(container)
    assert env["LEADER_SIDECAR_STORE"] == ETCD_TLS["store"]["etcd"]["endpoints"]
    assert env["LEADER_SIDECAR_ETCD_USERNAME"] == "leader-sidecar"
    assert env["LEADER_SIDECAR_ETCD_CA_FILE"] == "/etc/leader-sidecar/etcd-tls/ca.crt"
    assert env["LEADER_SIDECAR_ETCD_CERT_FILE"] == "/etc/leader-sidecar/etcd-tls/tls.crt"
    assert env["LEADER_SIDECAR_ETCD_KEY_FILE"] == "/etc/leader-sidecar/etcd-tls/tls.key"
    assert container["volumeMounts"] == [
        {
            "name": "leader-sidecar-etcd-tls",
            "mountPath": "/etc/leader-sidecar/etcd-tls",
            "readOnly": True,
        }
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-etcd-tls",
            "secret": {"secretName": "etcd-tls", "defaultMode": 0o444},
        }
    ]


def test_zookeeper_tls_files_come_from_a_mounted_secret_and_the_url_is_zookeepers(
    helm: Helm,
) -> None:
    deployment = example(helm.template(values=SWITCHES["zookeeper-tls"]))
    container = sidecar(deployment)
    env = environment(container)
    assert env["LEADER_SIDECAR_STORE"] == "zookeepers://zk-0.zk:2281,zk-1.zk:2281,zk-2.zk:2281"
    assert env["LEADER_SIDECAR_ZOOKEEPER_CA_FILE"] == "/etc/leader-sidecar/zookeeper-tls/ca.crt"
    assert env["LEADER_SIDECAR_ZOOKEEPER_CERT_FILE"] == (
        "/etc/leader-sidecar/zookeeper-tls/tls.crt"
    )
    assert env["LEADER_SIDECAR_ZOOKEEPER_KEY_FILE"] == "/etc/leader-sidecar/zookeeper-tls/tls.key"
    assert "LEADER_SIDECAR_ZOOKEEPER_PASSWORD" not in env
    assert container["volumeMounts"] == [
        {
            "name": "leader-sidecar-zookeeper-tls",
            "mountPath": "/etc/leader-sidecar/zookeeper-tls",
            "readOnly": True,
        }
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-zookeeper-tls",
            "secret": {"secretName": "zk-tls", "defaultMode": 0o444},
        }
    ]
    target = parse_target(env["LEADER_SIDECAR_STORE"], ca_file="ca.crt")
    assert target.tls


def test_the_zookeeper_url_is_built_from_its_values_and_the_password_from_the_secret(
    helm: Helm,
) -> None:
    """connectString and chroot make the store URL; the digest user is a variable and its
    password another, from the Secret — in no value, no release and no pod spec, and taken
    as it is (no percent-encoding)."""
    deployment = example(helm.template(values=SWITCHES["zookeeper-digest"]))
    container = sidecar(deployment)
    password = next(v for v in container["env"] if v["name"] == "LEADER_SIDECAR_ZOOKEEPER_PASSWORD")
    assert password == {
        "name": "LEADER_SIDECAR_ZOOKEEPER_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "zk-auth", "key": "password"}},
    }
    env = environment(container)
    assert env["LEADER_SIDECAR_ZOOKEEPER_USERNAME"] == "leader-sidecar"
    assert env["LEADER_SIDECAR_STORE"] == (
        "zookeeper://zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181/billing/leases"
    )
    assert "volumeMounts" not in container
    target = parse_target(
        env["LEADER_SIDECAR_STORE"], username="leader-sidecar", password="pa/ss:word"
    )
    assert target.hosts == (("zk-0.zk", 2181), ("zk-1.zk", 2181), ("zk-2.zk", 2181))
    assert target.chroot == "/billing/leases"
    assert (target.username, target.password) == ("leader-sidecar", "pa/ss:word")


def test_zookeeper_without_a_user_or_chroot_is_the_servers_alone(helm: Helm) -> None:
    """No user: no variable from a Secret and nothing before the servers; no chroot: the
    sidecar's default (/leader-sidecar)."""
    container = sidecar(example(helm.template(values=SWITCHES["zookeeper"])))
    assert environment(container)["LEADER_SIDECAR_STORE"] == "zookeeper://zk-0.zk:2181"
    names = [v["name"] for v in container["env"]]
    assert "LEADER_SIDECAR_ZOOKEEPER_PASSWORD" not in names
    assert "LEADER_SIDECAR_ZOOKEEPER_USERNAME" not in names


def test_without_the_kubernetes_store_no_rbac_and_no_api_token(helm: Helm) -> None:
    """Redis, etcd, PostgreSQL, ZooKeeper and SQLite never talk to the API server: no Role,
    and no token in the pods."""
    for switch in ("redis", "etcd", "sqlite", "postgresql", "zookeeper-digest"):
        manifests = helm.template(values=SWITCHES[switch])
        assert not find(manifests, "Role")
        assert not find(manifests, "RoleBinding")
        assert one(manifests, "ServiceAccount")["automountServiceAccountToken"] is False


def test_sqlite_writes_to_the_shared_volume_not_the_read_only_root(helm: Helm) -> None:
    deployment = example(helm.template(values=SWITCHES["sqlite"]))
    container = sidecar(deployment)
    assert environment(container)["LEADER_SIDECAR_STORE"] == (
        "sqlite:////var/lib/leader-sidecar/leader-sidecar.db"
    )
    assert container["volumeMounts"] == [
        {"name": "leader-sidecar-data", "mountPath": "/var/lib/leader-sidecar"}
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-data",
            "hostPath": {"path": "/var/lib/leader-sidecar", "type": "DirectoryOrCreate"},
        }
    ]


def test_the_leader_service_reaches_only_the_leader_of_this_lease(helm: Helm) -> None:
    """Its selector matches an example pod once the sidecar labels it leader — not before,
    not as follower, and not a leader of another lease."""
    manifests = helm.template(values=SWITCHES["example"])
    selector = one(manifests, "Service", "demo-leader-sidecar-leader")["spec"]["selector"]
    pod_labels = example(manifests)["spec"]["template"]["metadata"]["labels"]

    def selected(labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in selector.items())

    assert not selected(pod_labels)
    assert selected({**pod_labels, "leader-sidecar/role": "leader"})
    assert not selected({**pod_labels, "leader-sidecar/role": "follower"})
    other = {**pod_labels, "leader-sidecar/lease": "another-lease", "leader-sidecar/role": "leader"}
    assert not selected(other)
    assert one(manifests, "Service", "demo-leader-sidecar-leader")["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
        {"name": "sidecar-public", "port": 4041, "targetPort": "sidecar-public", "protocol": "TCP"},
    ]


def test_image_digest_wins_over_the_tag(helm: Helm) -> None:
    container = sidecar(example(helm.template(values=SWITCHES["extras"])))
    assert container["image"] == "leader-sidecar@sha256:" + "a" * 64
    tagged = sidecar(
        example(helm.template(values={**SWITCHES["example"], "image": {"tag": "1.2.3"}}))
    )
    assert tagged["image"] == "leader-sidecar:1.2.3"


def test_a_kubeconfig_gets_a_writable_tmp_for_its_certificates(helm: Helm) -> None:
    """The Kubernetes client writes a kubeconfig's embedded certificate data to temporary
    files; with a read-only root that needs a small tmpfs at /tmp."""
    deployment = example(helm.template(values=SWITCHES["kubeconfig"]))
    container = sidecar(deployment)
    env = environment(container)
    assert env["LEADER_SIDECAR_KUBECONFIG"] == "/etc/leader-sidecar/kubeconfig/kubeconfig"
    assert container["volumeMounts"] == [
        {
            "name": "leader-sidecar-kubeconfig",
            "mountPath": "/etc/leader-sidecar/kubeconfig",
            "readOnly": True,
        },
        {"name": "leader-sidecar-tmp", "mountPath": "/tmp"},
    ]
    assert pod_spec(deployment)["volumes"] == [
        {
            "name": "leader-sidecar-kubeconfig",
            "secret": {"secretName": "remote-cluster", "defaultMode": 0o444},
        },
        {"name": "leader-sidecar-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
