"""The Redis store as the rest of the sidecar knows it (`sidecar.backends.description`): the
``--store`` URLs, the ``--redis-*`` options and how they become the client's target."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import (
    Store,
    StoreConfig,
    WrongForm,
    check_files,
    check_together,
)
from sidecar.backends.endpoints import netloc_ok
from sidecar.config_error import ConfigError
from sidecar.options import Option, parse_count, parse_text

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.backends.redis.target import RedisSettings
    from sidecar.supervisor import Supervisor

SCHEMES = ("redis", "rediss", "redis+sentinel")

OPTIONS = (
    Option("--redis-username", parse_text, "Redis ACL user (overrides the URL's)", "USER"),
    Option(
        "--redis-password",
        parse_text,
        "Redis password (overrides the URL's; prefer the environment variable)",
        "PASSWORD",
        secret=True,
    ),
    Option(
        "--redis-ca-file",
        parse_text,
        "CA bundle that signs the Redis server certificate (rediss://)",
        "PATH",
    ),
    Option("--redis-cert-file", parse_text, "client certificate for Redis TLS", "PATH"),
    Option("--redis-key-file", parse_text, "client key for Redis TLS", "PATH"),
    Option(
        "--redis-sentinel-password",
        parse_text,
        "password of the Sentinels themselves (redis+sentinel://; prefer the env variable)",
        "PASSWORD",
        secret=True,
    ),
    Option(
        "--redis-min-replicas",
        parse_count,
        "a grant counts only after this many replicas acknowledged it (WAIT); default 0",
        "N",
    ),
)


def check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if not netloc_ok(parsed.netloc):
        raise WrongForm()
    if parsed.scheme == "redis+sentinel" and not parsed.path.strip("/"):
        raise WrongForm("a redis+sentinel:// URL needs the master name as its path")
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_files(values, "redis_cert_file", "redis_key_file", "redis_ca_file")
    check_together(values, "redis_cert_file", "redis_key_file")
    if values.get("redis_min_replicas") and not store.startswith(("redis", "rediss")):
        raise ConfigError(
            "--redis-min-replicas", values["redis_min_replicas"], "only applies to a redis store"
        )


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> RedisSettings:
    from sidecar.backends.redis.target import RedisSettings

    return RedisSettings(
        username=values.get("redis_username"),
        password=values.get("redis_password"),
        ca_file=values.get("redis_ca_file"),
        cert_file=values.get("redis_cert_file"),
        key_file=values.get("redis_key_file"),
        min_replicas=values.get("redis_min_replicas", 0),
        sentinel_password=values.get("redis_sentinel_password"),
    )


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    from sidecar.backends.redis import open_redis_client

    return open_redis_client(config, supervisor)


REDIS = Store(
    name="redis",
    schemes=SCHEMES,
    forms="redis://[user:password@]host:port/db, rediss://... or "
    "redis+sentinel://host:port[,host:port]/master-name[/db]",
    shown="redis://…, rediss://…, redis+sentinel://…",
    example="redis://127.0.0.1:6379/0",
    check_url=check_url,
    open_client=open_client,
    options=OPTIONS,
    check_options=check_options,
    settings=settings,
)
