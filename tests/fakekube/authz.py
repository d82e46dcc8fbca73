"""Optional RBAC for the fake: bearer tokens name users, Roles and RoleBindings decide.

Off by default (the fake then authorizes as before: any token is `FakeApiServer.user`, and
``system:anonymous`` is allowed unless ``anonymous=False``). Given an `Authorizer`, the fake
does what kube-apiserver's authentication and RBAC authorizer do, in that order:

* a token not in the table → 401; no token → ``system:anonymous`` (authorized by RBAC like
  anyone else, so refused unless a binding names it);
* each resource request is turned into RBAC's attributes exactly as ``RequestInfoFactory``
  does (`request_info`): the verb from the method (a GET of a collection is ``list``, or
  ``watch`` with ``?watch``; a DELETE of one is ``deletecollection``), API group, resource,
  subresource and name from the path, and for list/watch the name from
  ``fieldSelector=metadata.name=X`` — which is how ``resourceNames`` can limit list and watch;
* `tests.support.rbac.authorize` decides; a denial is the recorded 403 Status
  (``recorded/rbac.json``), before the fake looks anything up, so a missing object or a
  resource the fake does not serve is still a 403;
* the ``system:masters`` group is allowed everything, as kube-apiserver allows it before RBAC;
* non-resource paths (discovery, ``/version``, ``/healthz``, ``/openapi``) are open to every
  user, as the default ``system:discovery`` and ``system:public-info-viewer`` bindings make
  them.

Only Roles and RoleBindings to Roles: anything cluster-wide is refused when loading, rather
than quietly ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from tests.support.rbac import Decision, Manifest, Request, User, authorize

_SPECIAL_VERBS = ("proxy", "watch")  # /apis/g/v/watch/... : the verb is in the path
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def request_info(method: str, path: str, query: Mapping[str, str]) -> Request | None:
    """RBAC's attributes of a resource request; None for a non-resource path."""
    stripped = path.strip("/")
    parts = stripped.split("/") if stripped else []
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return None
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:  # /apis/<group>/<version>: discovery
            return None
        group, parts = parts[0], parts[1:]
    parts = parts[1:]  # the version
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return None
        verb, parts = parts[0], parts[1:]
    else:
        verb = {
            "POST": "create",
            "GET": "get",
            "HEAD": "get",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        # /namespaces/<ns>/<resource>/...; but /namespaces/<ns>/status is the Namespace's.
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if _is_true(query.get("watch")) else "list"
        name = _exact_name(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Request(verb, group, resource, namespace, name, subresource)


def _is_true(value: str | None) -> bool:
    """How url values convert to a bool in ListOptions: present and not 0/f/false."""
    return value is not None and value.lower() not in ("0", "f", "false")


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current + ("\\" if escaped else ""))
    return parts


def _exact_name(selector: str) -> str:
    """``fields.Selector.RequiresExactMatch("metadata.name")``, then the path-segment check:
    the name a list/watch selects, or "" (no selector, another field, ``!=``, unparseable)."""
    if not selector.strip():
        return ""
    terms = []
    for term in _split_unescaped(selector, ","):
        match = re.match(r"^(.*?)(!=|==|=)(.*)$", term)
        if match is None:
            return ""  # the whole selector fails to parse: no name
        terms.append((match[1].strip(), match[2], match[3].strip()))
    for field, op, value in terms:
        if field == "metadata.name" and op != "!=":
            name = re.sub(r"\\(.)", r"\1", value)
            if name in (".", "..") or "/" in name or "%" in name:
                return ""
            return name
    return ""


class Authorizer:
    """Tokens → users, and the Roles and RoleBindings that decide what they may do."""

    def __init__(self, objects: Iterable[Manifest], users: Mapping[str, User]) -> None:
        self.roles: list[Manifest] = []
        self.bindings: list[Manifest] = []
        for obj in objects:
            kind = obj.get("kind")
            name = (obj.get("metadata") or {}).get("name")
            if not (obj.get("metadata") or {}).get("namespace"):
                raise ValueError(f"{kind} {name}: needs metadata.namespace")
            if kind == "Role":
                self.roles.append(obj)
            elif kind == "RoleBinding" and obj.get("roleRef", {}).get("kind") == "Role":
                self.bindings.append(obj)
            else:
                raise ValueError(
                    f"{kind} {name}: the fake authorizes with Roles and RoleBindings to Roles only"
                )
        self.users = dict(users)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Authorizer:
        """From the control port's JSON: ``{"objects": [Role, RoleBinding, ...],
        "users": {"<token>": {"name": "...", "groups": [...]}}}``."""
        unknown = set(raw) - {"objects", "users"}
        if unknown:
            raise ValueError(f"unknown RBAC settings {sorted(unknown)}; allowed objects, users")
        users = {
            str(token): User.authenticated(str(user["name"]), user.get("groups") or [])
            for token, user in (raw.get("users") or {}).items()
        }
        return cls(raw.get("objects") or [], users)

    def authenticate(self, token: str) -> User | None:
        return self.users.get(token)

    def authorize(self, user: User, request: Request) -> Decision:
        return authorize(user, request, self.roles, self.bindings)

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "roles": [f"{r['metadata']['namespace']}/{r['metadata']['name']}" for r in self.roles],
            "bindings": [
                f"{b['metadata']['namespace']}/{b['metadata']['name']}" for b in self.bindings
            ],
            "users": sorted(user.name for user in self.users.values()),
        }
