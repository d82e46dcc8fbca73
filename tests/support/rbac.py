"""Kubernetes RBAC's matching rules for namespaced requests, as plain data.

One evaluator for two users: the chart tests ask it the questions the API server would ask of
the rendered Roles, and the fake API server's authorizer (`tests.fakekube.authz`) asks it for
every request it serves. It follows ``plugin/pkg/auth/authorizer/rbac`` and
``pkg/registry/rbac/validation`` of kube-apiserver: a request is allowed when a RoleBinding in
its namespace binds the user (by name, group or service account) to a Role in that namespace
with a rule that matches verb, API group, resource (``resource/subresource`` for a
subresource) and, when the rule lists ``resourceNames``, the request's name. Only Roles and
RoleBindings: nothing here grants anything cluster-wide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

Manifest = dict[str, Any]

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
AUTHENTICATED = "system:authenticated"
ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
MASTERS = "system:masters"  # kube-apiserver allows this group before RBAC is asked


@dataclasses.dataclass(frozen=True)
class Request:
    """What the authorizer sees. For list/watch with ``fieldSelector=metadata.name=X`` the API
    server puts X in ``name`` (that is how resourceNames can limit list and watch); for create
    the name is never known. ``resource`` may also be given combined (``pods/exec``)."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str = ""
    subresource: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @classmethod
    def authenticated(cls, name: str, groups: Iterable[str] = ()) -> User:
        """A user a token authenticates, with the groups kube-apiserver adds: every service
        account is in ``system:serviceaccounts`` and ``system:serviceaccounts:<namespace>``,
        everyone in ``system:authenticated``."""
        extra = []
        if name.startswith(SERVICE_ACCOUNT_PREFIX):
            namespace = name[len(SERVICE_ACCOUNT_PREFIX) :].split(":", 1)[0]
            extra = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        return cls(name, tuple(dict.fromkeys([*groups, *extra, AUTHENTICATED])))

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        return cls.authenticated(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}")

    @classmethod
    def anonymous(cls) -> User:
        return cls(ANONYMOUS, (UNAUTHENTICATED,))


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # as RBAC words it: "RBAC: allowed by ...", or why bindings failed, or ""


def _has(values: Sequence[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _resource_matches(rule: Manifest, request: Request) -> bool:
    for resource in rule.get("resources") or []:
        if resource in ("*", request.combined_resource):
            return True
        # "*/status" matches the status subresource of every resource.
        if request.subresource and resource == f"*/{request.subresource}":
            return True
    return False


def rule_allows(rule: Manifest, request: Request) -> bool:
    """One PolicyRule against one request (``rbac.RuleAllows``)."""
    names = rule.get("resourceNames") or []
    return (
        _has(rule.get("verbs") or [], request.verb)
        and _has(rule.get("apiGroups") or [], request.group)
        and _resource_matches(rule, request)
        and (not names or request.name in names)
    )


def allowed(roles: Iterable[Manifest], request: Request) -> bool:
    """Whether any rule of a Role in the request's namespace allows it (as if every Role were
    bound to the requester). A cluster-scoped request is never allowed by a Role."""
    if not request.namespace:
        return False
    return any(
        role["metadata"].get("namespace") == request.namespace
        and any(rule_allows(rule, request) for rule in role.get("rules") or [])
        for role in roles
    )


def applies_to(subject: Manifest, user: User, namespace: str) -> bool:
    """Whether a RoleBinding subject is this user (``appliesToUser``)."""
    kind = subject.get("kind")
    if kind == "User":
        return bool(subject.get("name") == user.name)
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        # An unqualified service account is one in the binding's namespace.
        sa_namespace = subject.get("namespace") or namespace
        return bool(sa_namespace) and user.name == (
            f"{SERVICE_ACCOUNT_PREFIX}{sa_namespace}:{subject.get('name')}"
        )
    return False


def _describe_subject(subject: Manifest, namespace: str) -> str:
    name = subject.get("name", "")
    if subject.get("kind") == "ServiceAccount":
        name = f"{name}/{subject.get('namespace') or namespace}"
    return f'{subject.get("kind")} "{name}"'


def _aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message alone, several deduplicated in []."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def authorize(
    user: User, request: Request, roles: Iterable[Manifest], bindings: Iterable[Manifest]
) -> Decision:
    """RBAC's answer for one request, with the reason kube-apiserver gives: which binding
    allowed it, or the bindings it could not resolve (a roleRef to a missing Role)."""
    if MASTERS in user.groups:
        return Decision(True, "")
    if not request.namespace:
        return Decision(False, "")
    by_name = {
        role["metadata"]["name"]: role
        for role in roles
        if role["metadata"].get("namespace") == request.namespace
    }
    errors: list[str] = []
    for binding in bindings:
        namespace = binding["metadata"].get("namespace")
        if namespace != request.namespace:
            continue
        subject = next(
            (s for s in binding.get("subjects") or [] if applies_to(s, user, namespace)), None
        )
        if subject is None:
            continue
        ref = binding["roleRef"]["name"]
        role = by_name.get(ref)
        if role is None:
            errors.append(f'role.rbac.authorization.k8s.io "{ref}" not found')
            continue
        if any(rule_allows(rule, request) for rule in role.get("rules") or []):
            return Decision(
                True,
                f'RBAC: allowed by RoleBinding "{binding["metadata"]["name"]}/{namespace}" of '
                f'Role "{ref}" to {_describe_subject(subject, namespace)}',
            )
    return Decision(False, f"RBAC: {_aggregate(errors)}" if errors else "")
