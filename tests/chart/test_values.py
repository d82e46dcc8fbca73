"""Bad values stop ``helm template``/``install`` with a message that names the value: types and
formats by values.schema.json, combinations by templates/_validate.tpl."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.helm import CHART, Helm, HelmError
from tests.chart.switches import EXAMPLE

SCHEMA_REJECTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown store",
        {"store": {"type": "consul"}},
        'store.type must be one of the following: "kubernetes", "redis", "sqlite", '
        '"postgresql", "etcd", "zookeeper"',
    ),
    (
        "zookeeper connect string as a URL",
        {"store": {"zookeeper": {"connectString": "zookeeper://zk-0.zk:2181"}}},
        "store.zookeeper.connectString: Does not match pattern",
    ),
    (
        "zookeeper connect string with a chroot",
        {"store": {"zookeeper": {"connectString": "zk-0.zk:2181,zk-1.zk:2181/billing"}}},
        "store.zookeeper.connectString: Does not match pattern",
    ),
    (
        "zookeeper connect string with a user and password",
        {"store": {"zookeeper": {"connectString": "app:hunter2@zk-0.zk:2181"}}},
        "store.zookeeper.connectString: Does not match pattern",
    ),
    (
        "zookeeper chroot without its slash",
        {"store": {"zookeeper": {"chroot": "billing"}}},
        "store.zookeeper.chroot: Does not match pattern",
    ),
    (
        "zookeeper user with a password in it",
        {"store": {"zookeeper": {"username": "app:hunter2"}}},
        "store.zookeeper.username: Does not match pattern",
    ),
    (
        "zookeeper password as a value",
        {"store": {"zookeeper": {"password": "hunter2"}}},
        "store.zookeeper: Additional property password is not allowed",
    ),
    (
        "misspelt top-level value",
        {"leaseDuration": "15s"},
        "Additional property leaseDuration is not allowed",
    ),
    (
        "misspelt nested value",
        {"lease": {"durationSeconds": 15}},
        "lease: Additional property durationSeconds is not allowed",
    ),
    (
        "duration with a bad unit",
        {"lease": {"duration": "15x"}},
        "lease.duration: Does not match pattern",
    ),
    ("negative duration", {"lease": {"duration": -1}}, "lease.duration: Must be greater than 0"),
    (
        "relative runbooks URL",
        {"prometheusRule": {"enabled": True, "runbooksUrl": "docs/operations.md"}},
        "prometheusRule.runbooksUrl: Does not match pattern",
    ),
    (
        "runbooks URL with an anchor",
        {"prometheusRule": {"enabled": True, "runbooksUrl": "https://wiki.example.com/rb#x"}},
        "prometheusRule.runbooksUrl: Does not match pattern",
    ),
    (
        "zero as a number",
        {"lease": {"renewInterval": 0}},
        "lease.renewInterval: Must be greater than 0",
    ),
    (
        "lease name not a DNS name",
        {"lease": {"name": "Payments_Ledger"}},
        "lease.name: Does not match pattern",
    ),
    (
        "lease name too long for a label",
        {"lease": {"name": "a" * 64}},
        "lease.name: String length must be less than or equal to 63",
    ),
    (
        "port out of range",
        {"public": {"port": 70000}},
        "public.port: Must be less than or equal to 65535",
    ),
    (
        "port as text",
        {"api": {"port": "4040"}},
        "api.port: Invalid type. Expected: integer, given: string",
    ),
    (
        "log level",
        {"log": {"level": "verbose"}},
        "log.level: log.level must be one of the following",
    ),
    (
        "webhook not http",
        {"webhook": {"url": "ftp://app/hook"}},
        "webhook.url: Does not match pattern",
    ),
    (
        "store URL of another scheme",
        {"store": {"type": "redis", "redis": {"url": "memcached://m:11211"}}},
        "store.redis.url: Does not match pattern",
    ),
    (
        "role label key with spaces",
        {"roleLabel": {"key": "leader sidecar/role"}},
        "roleLabel.key: Does not match pattern",
    ),
    (
        "digest that is not sha256",
        {"image": {"digest": "md5:abc"}},
        "image.digest: Does not match pattern",
    ),
    (
        "switch as text",
        {"nativeSidecar": "yes"},
        "nativeSidecar: Invalid type. Expected: boolean, given: string",
    ),
    (
        "grace period the sidecar cannot release in",
        {"example": {"terminationGracePeriodSeconds": 1}},
        "example.terminationGracePeriodSeconds: Must be greater than or equal to 3",
    ),
    (
        "leader service without ports",
        {"leaderService": {"ports": []}},
        "leaderService.ports: Array must have at least 1 items",
    ),
    (
        "scrape interval in Go syntax",
        {"metrics": {"podMonitor": {"interval": "1.5s"}}},
        "metrics.podMonitor.interval: Does not match pattern",
    ),
    (
        "app health path without the leading slash",
        {"app": {"health": {"path": "healthz", "port": 8080}}},
        "app.health.path: Does not match pattern",
    ),
    (
        "app health port zero",
        {"app": {"health": {"path": "/healthz", "port": 0}}},
        "app.health.port: Must be greater than or equal to 1",
    ),
    (
        "app health port out of range",
        {"app": {"health": {"path": "/healthz", "port": 70000}}},
        "app.health.port: Must be less than or equal to 65535",
    ),
    (
        "app health port by name (the URL needs a number)",
        {"app": {"health": {"path": "/healthz", "port": "http"}}},
        "app.health.port: Does not match pattern",
    ),
    (
        "app health period in Go syntax",
        {"app": {"health": {"path": "/healthz", "port": 8080, "period": "1m30s"}}},
        "app.health.period: Does not match pattern",
    ),
    (
        "app health failures zero",
        {"app": {"health": {"path": "/healthz", "port": 8080, "failures": 0}}},
        "app.health.failures: Must be greater than or equal to 1",
    ),
    (
        "app heartbeat zero",
        {"app": {"heartbeat": 0}},
        "app.heartbeat: Must be greater than 0",
    ),
    (
        "negative drain timeout",
        {"app": {"heartbeat": "10s", "drainTimeout": -1}},
        "app.drainTimeout: Must be greater than or equal to 0",
    ),
    (
        "misspelt app value",
        {"app": {"health": {"url": "http://127.0.0.1:8080/healthz"}}},
        "app.health: Additional property url is not allowed",
    ),
]

TEMPLATE_REJECTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "etcd without endpoints",
        {"store": {"type": "etcd"}, "leaderService": {"enabled": False}},
        "store.etcd.endpoints is required with store.type=etcd",
    ),
    (
        "etcd password in the URL",
        {
            "store": {"type": "etcd", "etcd": {"endpoints": "etcd://app:hunter2@etcd:2379"}},
            "leaderService": {"enabled": False},
        },
        "store.etcd.endpoints must not contain a password",
    ),
    (
        "etcd TLS files over plain etcd://",
        {
            "store": {
                "type": "etcd",
                "etcd": {"endpoints": "etcd://etcd:2379", "tls": {"existingSecret": "etcd-tls"}},
            },
            "leaderService": {"enabled": False},
        },
        "store.etcd.tls.existingSecret needs an etcds://",
    ),
    (
        "zookeeper without a connect string",
        {"store": {"type": "zookeeper"}, "leaderService": {"enabled": False}},
        "store.zookeeper.connectString is required with store.type=zookeeper",
    ),
    (
        "zookeeper client certificate without its key",
        {
            "store": {
                "type": "zookeeper",
                "zookeeper": {
                    "connectString": "zk-0.zk:2281",
                    "tls": {"existingSecret": "zk-tls", "certKey": "tls.crt"},
                },
            },
            "leaderService": {"enabled": False},
        },
        "store.zookeeper.tls.certKey and store.zookeeper.tls.keyKey go together",
    ),
    (
        "zookeeper TLS keys without their Secret",
        {
            "store": {
                "type": "zookeeper",
                "zookeeper": {
                    "connectString": "zk-0.zk:2281",
                    "tls": {"certKey": "tls.crt", "keyKey": "tls.key"},
                },
            },
            "leaderService": {"enabled": False},
        },
        "store.zookeeper.tls.* keys name entries of store.zookeeper.tls.existingSecret",
    ),
    (
        "zookeeper user without the Secret of its password",
        {
            "store": {
                "type": "zookeeper",
                "zookeeper": {"connectString": "zk-0.zk:2181", "username": "app"},
            },
            "leaderService": {"enabled": False},
        },
        "store.zookeeper.username needs its password from a Secret",
    ),
    (
        "zookeeper password Secret without its user",
        {
            "store": {
                "type": "zookeeper",
                "zookeeper": {"connectString": "zk-0.zk:2181", "existingSecret": "zk-auth"},
            },
            "leaderService": {"enabled": False},
        },
        "set store.zookeeper.username too",
    ),
    (
        "zookeeper with the leader Service",
        {"store": {"type": "zookeeper", "zookeeper": {"connectString": "zk-0.zk:2181"}}},
        "with store.type=zookeeper set leaderService.enabled=false",
    ),
    (
        "redis without a URL",
        {"store": {"type": "redis"}, "leaderService": {"enabled": False}},
        "store.redis.url is required with store.type=redis",
    ),
    (
        "redis password in the URL",
        {
            "store": {"type": "redis", "redis": {"url": "redis://:hunter2@redis:6379/0"}},
            "leaderService": {"enabled": False},
        },
        "store.redis.url must not contain a password",
    ),
    (
        "sentinel password without the secret",
        {
            "store": {
                "type": "redis",
                "redis": {
                    "url": "redis+sentinel://s:26379/m",
                    "existingSecretSentinelPasswordKey": "sp",
                },
            },
            "leaderService": {"enabled": False},
        },
        "names a key of store.redis.existingSecret",
    ),
    (
        "sentinel password without sentinels",
        {
            "store": {
                "type": "redis",
                "redis": {
                    "url": "redis://r:6379",
                    "existingSecret": "a",
                    "existingSecretSentinelPasswordKey": "sp",
                },
            },
            "leaderService": {"enabled": False},
        },
        "needs a redis+sentinel:// store.redis.url",
    ),
    (
        "client certificate without key",
        {
            "store": {
                "type": "redis",
                "redis": {
                    "url": "rediss://r:6380",
                    "tls": {"existingSecret": "t", "certKey": "tls.crt"},
                },
            },
            "leaderService": {"enabled": False},
        },
        "store.redis.tls.certKey and store.redis.tls.keyKey go together",
    ),
    (
        "tls keys without the secret",
        {
            "store": {
                "type": "redis",
                "redis": {
                    "url": "rediss://r:6380",
                    "tls": {"certKey": "tls.crt", "keyKey": "tls.key"},
                },
            },
            "leaderService": {"enabled": False},
        },
        "set that Secret's name",
    ),
    (
        "sqlite without a shared volume",
        {"store": {"type": "sqlite"}, "leaderService": {"enabled": False}},
        "store.sqlite.volume is required with store.type=sqlite",
    ),
    (
        "sqlite on an emptyDir",
        {
            "store": {"type": "sqlite", "sqlite": {"volume": {"emptyDir": {}}}},
            "leaderService": {"enabled": False},
        },
        "every pod would become leader",
    ),
    (
        "postgresql without a url",
        {"store": {"type": "postgresql"}, "leaderService": {"enabled": False}},
        "store.postgresql.url is required with store.type=postgresql",
    ),
    *(
        (
            f"a postgresql password in the url ({where})",
            {
                "store": {"type": "postgresql", "postgresql": {"url": url}},
                "leaderService": {"enabled": False},
            },
            "store.postgresql.url must not contain a password",
        )
        for where, url in (
            ("user:password@", "postgresql://sidecar:hunter2@db:5432/app"),
            ("?password=", "postgresql://sidecar@db:5432/app?sslmode=require&password=hunter2"),
        )
    ),
    (
        "leader service with redis",
        {"store": {"type": "redis", "redis": {"url": "redis://r:6379"}}},
        "with store.type=redis set leaderService.enabled=false",
    ),
    (
        "leader service without the role label",
        {"roleLabel": {"key": ""}},
        "leaderService.enabled needs roleLabel.key",
    ),
    (
        "two monitors",
        {"metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}},
        "would scrape every pod twice",
    ),
    (
        "rbac for the default account",
        {"serviceAccount": {"create": False}},
        "set serviceAccount.name to the ServiceAccount your pods use",
    ),
    (
        "one port for both listeners",
        {"api": {"port": 4041}},
        "api.port and public.port are both 4041",
    ),
    (
        "app health path without a port",
        {"app": {"health": {"path": "/healthz"}}},
        "app.health.path needs app.health.port (the sidecar checks "
        "http://127.0.0.1:<port><path>); set both or neither",
    ),
    (
        "app health port without a path",
        {"app": {"health": {"port": 8080}}},
        "app.health.port needs app.health.path (the sidecar checks "
        "http://127.0.0.1:<port><path>); set both or neither",
    ),
    *(
        (
            f"app health port is the sidecar's {which}",
            {"app": {"health": {"path": "/healthz", "port": port}}},
            f"app.health.port {port} is the sidecar's own (api.port or public.port)",
        )
        for which, port in (("api", 4040), ("public listener", 4041))
    ),
    *(
        (
            f"app health {key} without the health check",
            {"app": {"health": {key: value}, "heartbeat": "10s"}},
            f"app.health.{key} applies only with app.health.path and app.health.port (the "
            f"sidecar refuses --app-health-{key} without --app-health-url)",
        )
        for key, value in (
            ("period", "2s"),
            ("timeout", "500ms"),
            ("failures", 5),
            ("successes", 2),
        )
    ),
    *(
        (
            f"drain timeout {value!r} without an app check",
            {"app": {"drainTimeout": value}},
            "app.drainTimeout needs app.health.path and app.health.port, or app.heartbeat: "
            "without an app check the sidecar cannot tell when the app has stopped",
        )
        for value in ("30s", 0)
    ),
]


@pytest.mark.parametrize(
    ("values", "message"),
    [(v, m) for _, v, m in SCHEMA_REJECTS],
    ids=[c[0] for c in SCHEMA_REJECTS],
)
def test_the_schema_rejects_bad_values_naming_them(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(values={**EXAMPLE, **values})
    assert "values don't meet the specifications of the schema" in str(error.value)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [(v, m) for _, v, m in TEMPLATE_REJECTS],
    ids=[c[0] for c in TEMPLATE_REJECTS],
)
def test_combinations_that_cannot_work_are_refused_with_the_fix(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(values={**EXAMPLE, **values})
    assert "leader-sidecar: " in str(error.value)
    assert message in str(error.value)


def test_the_schema_accepts_the_chart_defaults_and_describes_every_value() -> None:
    """Every leaf of values.yaml is declared in the schema with a type (so a typo anywhere is
    refused, not ignored)."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        assert "type" in node or "enum" in node, f"{path}: no type in the schema"
        if isinstance(value, dict) and node.get("properties") is not None:
            assert node.get("additionalProperties") is False, f"{path}: open to typos"
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key}: not in the schema"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")
