"""What the fake knows about each kind it serves: how a body is decoded (400s), validated
(422s), defaulted and written out in the real field order. Leases in full; Pods and core/v1
Events as far as a leader-election sidecar uses them."""

from __future__ import annotations

import copy
import random
import string
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests.fakekube import wire
from tests.fakekube.wire import EVENTS, LEASES, PODS, ApiError, JsonObj

_CAUSE_INVALID = "FieldValueInvalid"
_CAUSE_REQUIRED = "FieldValueRequired"
_CAUSE_FORBIDDEN = "FieldValueForbidden"


def _go_type_name(value: Any) -> str:
    """How encoding/json names a JSON value in an UnmarshalTypeError."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return f"number {value}" if isinstance(value, float) else "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


class Kind:
    """Shared behaviour; subclasses fill in the specifics."""

    resource: tuple[str, str, str]
    api_version: str
    list_kind: str
    top_fields: frozenset[str] = frozenset({"kind", "apiVersion", "metadata"})
    field_selectors: tuple[str, ...] = ("metadata.name", "metadata.namespace")

    @property
    def kind(self) -> str:
        return self.resource[2]

    # -- decoding: anything here is a 400 -----------------------------------------------------

    def decode(self, body: Any, *, strict: bool) -> tuple[JsonObj, list[str]]:
        """The request body as the stored object (without server-set fields), plus the
        ``unknown field`` warnings."""
        if not isinstance(body, dict):
            raise wire.cannot_handle(
                self.kind,
                f"json: cannot unmarshal {_go_type_name(body).split()[0]} into Go value of type "
                f'struct {{ APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
                f'"json:\\"kind,omitempty\\"" }}',
            )
        kind = body.get("kind")
        if kind not in (None, "", self.kind):
            raise wire.bad_request(
                f'{kind} in version "v1" cannot be handled as a {self.kind}: no kind "{kind}" is '
                f'registered for version "{self.api_version}" in scheme '
                '"pkg/api/legacyscheme/scheme.go:30"'
            )
        warnings: list[str] = []
        for key in body:
            if key not in self.top_fields:
                warnings.append(key)
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise self._type_error("ObjectMeta", "metadata", metadata, "v1.ObjectMeta")
        for key in metadata:
            if key not in wire.METADATA_FIELDS:
                warnings.append(f"metadata.{key}")
        for field in ("labels", "annotations"):
            values = metadata.get(field)
            if values is None:
                metadata.pop(field, None)
                continue
            if not isinstance(values, dict):
                raise self._type_error(
                    "ObjectMeta", f"metadata.{field}", values, "map[string]string"
                )
            for value in values.values():
                if not isinstance(value, str):
                    raise self._type_error("ObjectMeta", f"metadata.{field}", value, "string")
        obj = self.decode_body(body, warnings)
        obj["metadata"] = {
            key: value for key, value in metadata.items() if key in wire.METADATA_FIELDS
        }
        if strict and warnings:
            raise wire.cannot_handle(
                self.kind, f'strict decoding error: unknown field "{warnings[0]}"'
            )
        return obj, [f'unknown field "{field}"' for field in warnings]

    def decode_body(self, body: JsonObj, warnings: list[str]) -> JsonObj:
        raise NotImplementedError

    def _type_error(self, struct: str, field: str, value: Any, go_type: str) -> ApiError:
        return wire.cannot_handle(
            self.kind,
            f"json: cannot unmarshal {_go_type_name(value)} into Go struct field "
            f"{struct}.{field} of type {go_type}",
        )

    # -- validation: anything here is a 422 ---------------------------------------------------

    def validate(self, obj: JsonObj, old: JsonObj | None) -> None:
        causes = self.metadata_causes(obj, creating=old is None)
        causes += self.causes(obj, old)
        if causes:
            raise wire.invalid(self.resource, obj["metadata"].get("name", ""), causes)

    def metadata_causes(self, obj: JsonObj, *, creating: bool) -> list[tuple[str, str, str]]:
        causes: list[tuple[str, str, str]] = []
        name = obj["metadata"].get("name", "")
        if creating and not name:
            causes.append(
                (
                    "metadata.name",
                    "Required value: name or generateName is required",
                    _CAUSE_REQUIRED,
                )
            )
        elif creating and not wire.is_subdomain(name):
            causes.append(
                (
                    "metadata.name",
                    f"Invalid value: {wire.quote(name)}: {wire.SUBDOMAIN_HELP}",
                    _CAUSE_INVALID,
                )
            )
        for key, value in (obj["metadata"].get("labels") or {}).items():
            for problem in wire.label_key_errors(key):
                causes.append(
                    (
                        "metadata.labels",
                        f"Invalid value: {wire.quote(key)}: {problem}",
                        _CAUSE_INVALID,
                    )
                )
            if not wire.label_value_ok(value):
                causes.append(
                    (
                        "metadata.labels",
                        f"Invalid value: {wire.quote(value)}: {wire.LABEL_VALUE_HELP}",
                        _CAUSE_INVALID,
                    )
                )
        return causes

    def causes(self, obj: JsonObj, old: JsonObj | None) -> list[tuple[str, str, str]]:
        return []

    # -- server-set fields and output -----------------------------------------------------------

    def on_create(self, obj: JsonObj, now: datetime) -> None:
        """Defaults the server fills in when the object is created."""

    def on_update(self, obj: JsonObj, old: JsonObj) -> None:
        """Carry over what a client cannot change (status, defaults)."""

    def output(self, obj: JsonObj) -> JsonObj:
        """Field order as the real server writes it, with kind/apiVersion first."""
        body = {"kind": self.kind, "apiVersion": self.api_version}
        body["metadata"] = wire.ordered_metadata(obj["metadata"])
        body.update(self.output_body(obj))
        return body

    def output_body(self, obj: JsonObj) -> JsonObj:
        return {
            key: value
            for key, value in obj.items()
            if key not in ("kind", "apiVersion", "metadata")
        }

    def field_value(self, obj: JsonObj, field: str) -> str | None:
        if field == "metadata.name":
            return str(obj["metadata"].get("name", ""))
        if field == "metadata.namespace":
            return str(obj["metadata"].get("namespace", ""))
        return None


# -- Lease ----------------------------------------------------------------------------------------

_LEASE_SPEC = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
)
_LEASE_DROPPED = ("strategy", "preferredHolder")  # the CoordinatedLeaderElection gate is off


class LeaseKind(Kind):
    resource = LEASES
    api_version = "coordination.k8s.io/v1"
    list_kind = "LeaseList"
    top_fields = frozenset({"kind", "apiVersion", "metadata", "spec"})

    def decode_body(self, body: JsonObj, warnings: list[str]) -> JsonObj:
        raw = body.get("spec")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise self._type_error("Lease", "spec", raw, "v1.LeaseSpec")
        spec: JsonObj = {}
        for key, value in raw.items():
            if key not in _LEASE_SPEC and key not in _LEASE_DROPPED:
                warnings.append(f"spec.{key}")
                continue
            if value is None or key in _LEASE_DROPPED:
                continue
            if key == "holderIdentity":
                if not isinstance(value, str):
                    raise self._type_error("LeaseSpec", f"spec.{key}", value, "string")
                spec[key] = value
            elif key in ("leaseDurationSeconds", "leaseTransitions"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise self._type_error("LeaseSpec", f"spec.{key}", value, "int32")
                if not -(2**31) <= value < 2**31:  # Go's decoder: "number N" past an int32
                    raise wire.cannot_handle(
                        self.kind,
                        f"json: cannot unmarshal number {value} into Go struct field "
                        f"LeaseSpec.spec.{key} of type int32",
                    )
                spec[key] = value
            else:
                if not isinstance(value, str):
                    raise self._type_error("LeaseSpec", f"spec.{key}", value, "v1.MicroTime")
                try:
                    spec[key] = wire.format_micro_time(wire.parse_micro_time(value))
                except wire.TimeParseError as exc:
                    raise wire.cannot_handle(self.kind, str(exc)) from None
        return {"spec": spec}

    def causes(self, obj: JsonObj, old: JsonObj | None) -> list[tuple[str, str, str]]:
        spec = obj["spec"]
        causes = []
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and duration <= 0:
            causes.append(
                (
                    "spec.leaseDurationSeconds",
                    f"Invalid value: {duration}: must be greater than 0",
                    _CAUSE_INVALID,
                )
            )
        transitions = spec.get("leaseTransitions")
        if transitions is not None and transitions < 0:
            causes.append(
                (
                    "spec.leaseTransitions",
                    f"Invalid value: {transitions}: must be greater than or equal to 0",
                    _CAUSE_INVALID,
                )
            )
        return causes

    def output_body(self, obj: JsonObj) -> JsonObj:
        return {"spec": wire.ordered(obj.get("spec", {}), _LEASE_SPEC)}

    def holder(self, obj: JsonObj) -> str:
        return str(obj.get("spec", {}).get("holderIdentity", ""))


# -- Pod ------------------------------------------------------------------------------------------

_POD_SPEC_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("restartPolicy", "Always"),
    ("terminationGracePeriodSeconds", 30),
    ("dnsPolicy", "ClusterFirst"),
    ("serviceAccountName", "default"),
    ("serviceAccount", "default"),
    ("securityContext", {}),
    ("schedulerName", "default-scheduler"),
    (
        "tolerations",
        [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    ),
    ("priority", 0),
    ("enableServiceLinks", True),
    ("preemptionPolicy", "PreemptLowerPriority"),
)
_POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
    "to 1 if it was previously negative)"
)


class PodKind(Kind):
    resource = PODS
    api_version = "v1"
    list_kind = "PodList"
    top_fields = frozenset({"kind", "apiVersion", "metadata", "spec", "status"})
    field_selectors = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")

    def decode_body(self, body: JsonObj, warnings: list[str]) -> JsonObj:
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise self._type_error("Pod", "spec", spec, "v1.PodSpec")
        return {"spec": copy.deepcopy(spec), "status": copy.deepcopy(body.get("status") or {})}

    def metadata_causes(self, obj: JsonObj, *, creating: bool) -> list[tuple[str, str, str]]:
        # As recorded: a pod's invalid label is reported four times (the label is validated
        # by several layers of pod validation), each as its own cause.
        causes = super().metadata_causes(obj, creating=creating)
        return [cause for cause in causes for _ in range(4 if cause[0] == "metadata.labels" else 1)]

    def causes(self, obj: JsonObj, old: JsonObj | None) -> list[tuple[str, str, str]]:
        if old is None:
            if not obj["spec"].get("containers"):
                return [("spec.containers", "Required value", _CAUSE_REQUIRED)]
            return []

        def comparable(spec: JsonObj) -> JsonObj:
            spec = copy.deepcopy(spec)
            for container in spec.get("containers", []):
                container.pop("image", None)
            for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
                spec.pop(field, None)
            return spec

        if comparable(obj["spec"]) != comparable(old["spec"]):
            return [("spec", f"Forbidden: {_POD_UPDATE_FORBIDDEN}", _CAUSE_FORBIDDEN)]
        return []

    def on_create(self, obj: JsonObj, now: datetime) -> None:
        obj["metadata"]["generation"] = 1
        spec = obj["spec"]
        for container in spec.get("containers", []):
            container.setdefault("resources", {})
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault(
                "imagePullPolicy",
                "Always" if str(container.get("image", "")).endswith(":latest") else "IfNotPresent",
            )
        for field, default in _POD_SPEC_DEFAULTS:
            spec.setdefault(field, copy.deepcopy(default))
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}

    def on_update(self, obj: JsonObj, old: JsonObj) -> None:
        obj["status"] = copy.deepcopy(old.get("status", {}))  # status is a subresource
        obj["metadata"]["generation"] = old["metadata"].get("generation", 1)

    def output_body(self, obj: JsonObj) -> JsonObj:
        return {"spec": obj.get("spec", {}), "status": obj.get("status", {})}

    def field_value(self, obj: JsonObj, field: str) -> str | None:
        if field == "spec.nodeName":
            return str(obj["spec"].get("nodeName", ""))
        if field == "status.phase":
            return str(obj.get("status", {}).get("phase", ""))
        return super().field_value(obj, field)


# -- core/v1 Event --------------------------------------------------------------------------------

_EVENT_FIELDS = (
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "series",
    "action",
    "related",
    "reportingComponent",
    "reportingInstance",
)
_OBJECT_REFERENCE = (
    "kind",
    "namespace",
    "name",
    "uid",
    "apiVersion",
    "resourceVersion",
    "fieldPath",
)


class EventKind(Kind):
    resource = EVENTS
    api_version = "v1"
    list_kind = "EventList"
    top_fields = frozenset({"kind", "apiVersion", "metadata", *_EVENT_FIELDS})
    field_selectors = (
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    )

    def decode_body(self, body: JsonObj, warnings: list[str]) -> JsonObj:
        obj: JsonObj = {}
        for field in _EVENT_FIELDS:
            if field not in body:
                continue
            value = body[field]
            if field in ("firstTimestamp", "lastTimestamp") and value is not None:
                try:
                    value = wire.format_time(wire.parse_time(str(value)))
                except wire.TimeParseError as exc:
                    raise wire.cannot_handle(self.kind, str(exc)) from None
            if field == "eventTime" and value is not None:
                try:
                    value = wire.format_micro_time(wire.parse_micro_time(str(value)))
                except wire.TimeParseError as exc:
                    raise wire.cannot_handle(self.kind, str(exc)) from None
            obj[field] = copy.deepcopy(value)
        return obj

    def causes(self, obj: JsonObj, old: JsonObj | None) -> list[tuple[str, str, str]]:
        causes = []
        involved_ns = (obj.get("involvedObject") or {}).get("namespace", "")
        if involved_ns != obj["metadata"].get("namespace", ""):
            causes.append(
                (
                    "involvedObject.namespace",
                    f"Invalid value: {wire.quote(involved_ns)}: does not match event.namespace",
                    _CAUSE_INVALID,
                )
            )
        if obj.get("eventTime"):
            component = obj.get("reportingComponent") or ""
            if not component:
                causes.append(("reportingComponent", "Required value", _CAUSE_REQUIRED))
                causes.append(
                    (
                        "reportingComponent",
                        'Invalid value: "": name part must be non-empty',
                        _CAUSE_INVALID,
                    )
                )
            if not component or wire.label_key_errors(component):
                causes.append(
                    (
                        "reportingComponent",
                        f"Invalid value: {wire.quote(component)}: {wire.NAME_PART_HELP}",
                        _CAUSE_INVALID,
                    )
                )
            if not obj.get("reportingInstance"):
                causes.append(("reportingInstance", "Required value", _CAUSE_REQUIRED))
            if not obj.get("action"):
                causes.append(("action", "Required value", _CAUSE_REQUIRED))
        return causes

    def on_create(self, obj: JsonObj, now: datetime) -> None:
        obj.setdefault("source", {})
        for field in ("firstTimestamp", "lastTimestamp", "eventTime"):
            obj.setdefault(field, None)
        obj.setdefault("reportingComponent", "")
        obj.setdefault("reportingInstance", "")

    def output_body(self, obj: JsonObj) -> JsonObj:
        body = wire.ordered(
            {key: value for key, value in obj.items() if key != "metadata"}, _EVENT_FIELDS
        )
        if isinstance(body.get("involvedObject"), dict):
            body["involvedObject"] = wire.ordered(body["involvedObject"], _OBJECT_REFERENCE)
        return body

    def field_value(self, obj: JsonObj, field: str) -> str | None:
        head, _, tail = field.partition(".")
        if head == "involvedObject":
            return str((obj.get("involvedObject") or {}).get(tail, ""))
        if field == "source":
            return str((obj.get("source") or {}).get("component", ""))
        if field in ("reason", "reportingComponent", "type"):
            return str(obj.get(field) or "")
        return super().field_value(obj, field)


KINDS: dict[tuple[str, str, str], Kind] = {
    LEASES: LeaseKind(),
    PODS: PodKind(),
    EVENTS: EventKind(),
}

# -- server-set metadata ---------------------------------------------------------------------

_GENERATE_ALPHABET = (
    "bcdfghjklmnpqrstvwxz2456789"  # what apiserver's names.SimpleNameGenerator uses
)


def generate_name(prefix: str, rng: Callable[[int], str] | None = None) -> str:
    suffix = (rng or (lambda n: "".join(random.choices(_GENERATE_ALPHABET, k=n))))(5)
    return prefix + suffix


def new_uid() -> str:
    return str(uuid.uuid4())


def fields_v1(body: JsonObj) -> JsonObj:
    """An approximation of the managedFields set a write touches: every field present in the
    request body (maps such as labels carry ``"."``, as the real server writes them)."""

    def walk(value: Any, is_map: bool) -> JsonObj:
        if not isinstance(value, dict) or not value:
            return {}
        out: JsonObj = {".": {}} if is_map else {}
        for key in sorted(value):
            out[f"f:{key}"] = walk(value[key], key in ("labels", "annotations"))
        return out

    out: JsonObj = {}
    metadata = body.get("metadata") or {}
    meta_fields = {
        f"f:{field}": walk(metadata[field], True)
        for field in ("labels", "annotations")
        if metadata.get(field)
    }
    if meta_fields:
        out["f:metadata"] = meta_fields
    for key in sorted(body):
        if key in ("kind", "apiVersion", "metadata", "status") or body[key] is None:
            continue
        if key in ("involvedObject", "related"):
            out[f"f:{key}"] = {}  # atomic structs
        else:
            out[f"f:{key}"] = walk(body[key], False)
    return out


def managed_fields(
    existing: list[JsonObj],
    manager: str,
    api_version: str,
    body: JsonObj,
    now: datetime,
    operation: str = "Update",
) -> list[JsonObj]:
    """One entry per manager; a manager's newest write replaces its entry."""
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": wire.format_time(now),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(body),
    }
    others = [item for item in existing if item.get("manager") != manager]
    return [*others, entry]


def user_agent_manager(user_agent: str | None) -> str:
    """The field manager the server derives from the User-Agent: up to its first ``/``."""
    agent = (user_agent or "unknown").split("/", 1)[0]
    return agent or "unknown"


def random_suffix(length: int) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=length))
