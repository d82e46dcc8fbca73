"""Discovery, version and OpenAPI documents, taken from the recorded transcripts and cut down
to what the fake serves (Leases; Pods, core Events and Namespaces), so that kubectl finds
exactly the resources that work."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "recorded"

SERVED_CORE = ("events", "namespaces", "pods")
SERVED_GROUPS = ("coordination.k8s.io",)
AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
COORDINATION_OPENAPI = "apis/coordination.k8s.io/v1"


@functools.cache
def recorded(topic: str) -> dict[str, dict[str, Any]]:
    """``recorded/<topic>.json`` exchanges by name."""
    data = json.loads((RECORDED / f"{topic}.json").read_text())
    return {exchange["name"]: exchange for exchange in data["exchanges"]}


def _body(topic: str, name: str) -> Any:
    return copy.deepcopy(recorded(topic)[name]["response"]["body"])


def version() -> Any:
    return _body("discovery", "version")


def api_versions(server_address: str) -> Any:
    body = _body("discovery", "api-legacy")
    body["serverAddressByClientCIDRs"] = [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
    ]
    return body


def api_aggregated() -> Any:
    body = _body("discovery", "api-aggregated")
    for item in body["items"]:
        for version_entry in item["versions"]:
            version_entry["resources"] = [
                {key: value for key, value in resource.items() if key != "subresources"}
                for resource in version_entry["resources"]
                if resource["resource"] in SERVED_CORE
            ]
    return body


def apis_legacy() -> Any:
    body = _body("discovery", "apis-legacy")
    body["groups"] = [group for group in body["groups"] if group["name"] in SERVED_GROUPS]
    return body


def apis_aggregated() -> Any:
    body = _body("discovery", "apis-aggregated")
    body["items"] = [item for item in body["items"] if item["metadata"]["name"] in SERVED_GROUPS]
    return body


def core_v1_resources() -> Any:
    body = _body("discovery", "api-v1")
    body["resources"] = [
        resource for resource in body["resources"] if resource["name"] in SERVED_CORE
    ]
    return body


def group(name: str) -> Any:
    if name == "coordination.k8s.io":
        return _body("discovery", "group-coordination")
    return None


def group_version(name: str) -> Any:
    if name == "coordination.k8s.io/v1":
        return _body("discovery", "groupversion-coordination-v1")
    return None


def openapi_root() -> Any:
    body = _body("discovery", "openapi-v3-root")
    body["paths"] = {COORDINATION_OPENAPI: body["paths"][COORDINATION_OPENAPI]}
    return body


@functools.cache
def openapi_coordination() -> bytes:
    return json.dumps(
        _body("discovery", "openapi-v3-coordination-v1"), separators=(",", ":")
    ).encode()


def openapi_hash() -> str:
    url = str(openapi_root()["paths"][COORDINATION_OPENAPI]["serverRelativeURL"])
    return url.partition("hash=")[2]


def etag(payload: bytes) -> str:
    return '"' + hashlib.sha512(payload).hexdigest().upper() + '"'


@functools.cache
def lease_table_columns() -> list[Any]:
    """The Lease Table's columnDefinitions (Name, Holder, Age) exactly as recorded."""
    body = recorded("kubectl")["replay-list-table"]["response"]["body"]
    return list(body["columnDefinitions"])
