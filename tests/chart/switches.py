"""The chart's switches, each as the values a user would set, for lint, render and validation.

Every switch turns on the example app too (where the store allows), so the sidecar container is
rendered and validated in each variant, not only the objects around it."""

from __future__ import annotations

from typing import Any

from tests.support.tools import REPO

DASHBOARD_SOURCE = REPO / "sidecar" / "prometheus" / "dashboard.json"

EXAMPLE: dict[str, Any] = {"example": {"enabled": True}}

REDIS_TLS: dict[str, Any] = {
    "store": {
        "type": "redis",
        "redis": {
            "url": "rediss://redis-master.data:6380/0",
            "username": "leader-sidecar",
            "existingSecret": "redis-auth",
            "tls": {"existingSecret": "redis-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
            "minReplicas": 1,
        },
    },
    "leaderService": {"enabled": False},
}

ETCD_TLS: dict[str, Any] = {
    "store": {
        "type": "etcd",
        "etcd": {
            "endpoints": "etcds://etcd-0.etcd:2379,etcd-1.etcd:2379,etcd-2.etcd:2379/my-app",
            "username": "leader-sidecar",
            "existingSecret": "etcd-auth",
            "tls": {"existingSecret": "etcd-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
        },
    },
    "leaderService": {"enabled": False},
}

ZOOKEEPER_DIGEST: dict[str, Any] = {
    "store": {
        "type": "zookeeper",
        "zookeeper": {
            "connectString": "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181",
            "chroot": "/billing/leases",
            "username": "leader-sidecar",
            "existingSecret": "zk-auth",
        },
    },
    "leaderService": {"enabled": False},
}

ZOOKEEPER_TLS: dict[str, Any] = {
    "store": {
        "type": "zookeeper",
        "zookeeper": {
            "connectString": "zk-0.zk:2281,zk-1.zk:2281,zk-2.zk:2281",
            "tls": {"existingSecret": "zk-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
        },
    },
    "leaderService": {"enabled": False},
}

SWITCHES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "example": EXAMPLE,
    "native-sidecar": {**EXAMPLE, "nativeSidecar": True},
    "redis": {
        **EXAMPLE,
        "store": {
            "type": "redis",
            "redis": {"url": "redis://redis-master.data:6379/0", "existingSecret": "redis-auth"},
        },
        "leaderService": {"enabled": False},
    },
    "redis-tls": {**EXAMPLE, **REDIS_TLS},
    "etcd": {
        **EXAMPLE,
        "store": {
            "type": "etcd",
            "etcd": {"endpoints": "etcd://etcd-0.etcd:2379,etcd-1.etcd:2379"},
        },
        "leaderService": {"enabled": False},
    },
    "etcd-tls": {**EXAMPLE, **ETCD_TLS},
    "zookeeper": {
        **EXAMPLE,
        "store": {"type": "zookeeper", "zookeeper": {"connectString": "zk-0.zk:2181"}},
        "leaderService": {"enabled": False},
    },
    "zookeeper-digest": {**EXAMPLE, **ZOOKEEPER_DIGEST},
    "zookeeper-tls": {**EXAMPLE, **ZOOKEEPER_TLS},
    "redis-sentinel": {
        **EXAMPLE,
        "store": {
            "type": "redis",
            "redis": {
                "url": "redis+sentinel://sentinel-0:26379,sentinel-1:26379/mymaster/0",
                "existingSecret": "redis-auth",
                "existingSecretSentinelPasswordKey": "sentinel-password",
            },
        },
        "leaderService": {"enabled": False},
    },
    "postgresql": {
        **EXAMPLE,
        "store": {
            "type": "postgresql",
            "postgresql": {
                "url": "postgresql://sidecar@db-0.data:5432,db-1.data:5432/app?sslmode=verify-full"
                "&sslrootcert=/etc/leader-sidecar/postgresql-tls/ca.crt",
                "existingSecret": "db-auth",
                "tlsSecret": "db-tls",
            },
        },
        "leaderService": {"enabled": False},
    },
    "sqlite": {
        "example": {"enabled": True, "replicas": 1},
        "store": {
            "type": "sqlite",
            "sqlite": {
                "volume": {
                    "hostPath": {"path": "/var/lib/leader-sidecar", "type": "DirectoryOrCreate"}
                }
            },
        },
        "leaderService": {"enabled": False},
    },
    "pod-monitor": {
        **EXAMPLE,
        "metrics": {"podMonitor": {"enabled": True, "interval": "15s", "labels": {"team": "a"}}},
    },
    "service-monitor": {
        **EXAMPLE,
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "30s", "scrapeTimeout": "5s"}},
    },
    "prometheus-rule": {
        **EXAMPLE,
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "lease-in-another-namespace": {
        **EXAMPLE,
        "lease": {"name": "payments", "namespace": "coordination"},
    },
    "existing-service-account": {
        **EXAMPLE,
        "serviceAccount": {"create": False, "name": "payments"},
    },
    "no-rbac-no-leader-service": {
        **EXAMPLE,
        "rbac": {"create": False},
        "leaderService": {"enabled": False},
    },
    "webhook-and-signal": {
        **EXAMPLE,
        "webhook": {"url": "http://127.0.0.1:8080/leader-changed", "timeout": "1s", "retries": 5},
        "signal": {"process": "payments", "name": "SIGUSR1"},
    },
    "kubeconfig": {**EXAMPLE, "kubeconfig": {"existingSecret": "remote-cluster"}},
    "timing-and-identity": {
        **EXAMPLE,
        "identity": "payments",
        "lease": {
            "duration": "10s",
            "renewInterval": 3,
            "retryPeriod": "1500ms",
            "requestTimeout": "1s",
        },
        "log": {"format": "text", "level": "debug"},
        "api": {"host": "127.0.0.1", "port": 5050},
        "public": {"host": "::", "port": 5051},
    },
    "limits": {
        **EXAMPLE,
        "limits": {
            "maxConnections": 512,
            "maxLongPolls": "32",
            "maxLongPollsPerPeer": 4,
            "maxEventStreams": 8,
            "idleTimeout": "5s",
        },
    },
    "many-shards": {  # past 10 leases: one labelled watch, list/watch without names
        **EXAMPLE,
        "lease": {"name": "jobs", "shards": 12},
        "metrics": {"perLease": True},
    },
    "shards": {
        **EXAMPLE,
        "lease": {
            "names": ["jobs", "billing"],
            "shards": 4,
            "group": "workers",
            "transferTimeout": "3s",
        },
        "priority": 10,
    },
    "app-health": {  # leadership follows the app: every app value set
        **EXAMPLE,
        "app": {
            "health": {
                "path": "/healthz",
                "port": 8080,
                "period": "2s",
                "timeout": "500ms",
                "failures": 5,
                "successes": "2",
            },
            "heartbeat": "30s",
            "drainTimeout": "20s",
        },
    },
    "app-heartbeat-native": {  # the heartbeat alone, the app stopping before the sidecar
        **EXAMPLE,
        "nativeSidecar": True,
        "app": {"heartbeat": "10s", "drainTimeout": 0},
    },
    "extras": {
        **EXAMPLE,
        "extraArgs": ["--log-level", "warning"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "image": {"digest": "sha256:" + "a" * 64},
        "podSelector": {"app": "payments"},
    },
}

if DASHBOARD_SOURCE.exists():
    SWITCHES["dashboard"] = {
        **EXAMPLE,
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Leader election"}},
    }

# Every kubernetes-store switch that can be on at once.
SWITCHES["everything"] = {
    **EXAMPLE,
    "nativeSidecar": True,
    "metrics": {"podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "dashboard": {"enabled": DASHBOARD_SOURCE.exists()},
    "webhook": {"url": "http://127.0.0.1:8080/leader-changed"},
    "signal": {"process": "payments"},
    "lease": {"name": "payments", "namespace": "coordination", "duration": "20s"},
    "identity": "payments",
}
