"""Wire formats of the real API server, copied from the recorded transcripts (``recorded/``):
Status bodies, time formats, field order, validation messages, JSON encoding."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

JsonObj = dict[str, Any]

LEASES = ("coordination.k8s.io", "leases", "Lease")
PODS = ("", "pods", "Pod")
EVENTS = ("", "events", "Event")
NAMESPACES = ("", "namespaces", "Namespace")


class ApiError(Exception):
    """Answered as a ``Status`` body with this code, or with ``text`` as a plain-text body
    (what the API server's filters write: API Priority and Fairness's 429)."""

    def __init__(
        self,
        code: int,
        body: JsonObj,
        headers: dict[str, str] | None = None,
        *,
        text: str | None = None,
    ) -> None:
        super().__init__(body.get("message", "") if text is None else text)
        self.code = code
        self.body = body
        self.headers = headers or {}
        self.text = text


# -- JSON -------------------------------------------------------------------------------------


def dumps(value: Any, pretty: bool = False) -> bytes:
    """Compact one-line JSON ending in a newline, as the server writes it."""
    if pretty:
        return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()
    return (json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


# -- Status bodies ----------------------------------------------------------------------------


def status(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    body: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _resource_ref(resource: tuple[str, str, str]) -> str:
    group, plural, _ = resource
    return f"{plural}.{group}" if group else plural


def _details(resource: tuple[str, str, str], name: str, kind: str | None = None) -> JsonObj:
    group, plural, _ = resource
    details: JsonObj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind or plural
    return details


def not_found(resource: tuple[str, str, str], name: str) -> ApiError:
    return ApiError(
        404,
        status(
            404,
            "NotFound",
            f'{_resource_ref(resource)} "{name}" not found',
            _details(resource, name),
        ),
    )


def path_not_found() -> ApiError:
    return ApiError(
        404, status(404, "NotFound", "the server could not find the requested resource", {})
    )


def already_exists(resource: tuple[str, str, str], name: str) -> ApiError:
    return ApiError(
        409,
        status(
            409,
            "AlreadyExists",
            f'{_resource_ref(resource)} "{name}" already exists',
            _details(resource, name),
        ),
    )


def conflict(resource: tuple[str, str, str], name: str) -> ApiError:
    return ApiError(
        409,
        status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {_resource_ref(resource)} "{name}": the object '
            "has been modified; please apply your changes to the latest version and try again",
            _details(resource, name),
        ),
    )


def precondition_conflict(
    resource: tuple[str, str, str], name: str, what: str, wanted: str, actual: str
) -> ApiError:
    group, _, kind = resource
    ref = f"{kind}.{group}" if group else kind
    field = "ResourceVersion" if what == "resourceVersion" else "UID"
    return ApiError(
        409,
        status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {ref} "{name}": the {field} in the precondition '
            f"({wanted}) does not match the {field} in record ({actual}). "
            + (
                "The object might have been modified"
                if what == "resourceVersion"
                else "The object might have been deleted and then recreated"
            ),
            _details(resource, name, kind),
        ),
    )


def invalid(
    resource: tuple[str, str, str],
    name: str,
    causes: list[tuple[str, str, str]],
    *,
    plural_ref: bool = False,
) -> ApiError:
    """422. ``causes`` are (field, cause message, reason). Leases name themselves
    ``Lease.coordination.k8s.io`` for validation errors but ``leases.coordination.k8s.io`` for
    the missing-resourceVersion error (``plural_ref``)."""
    group, plural, kind = resource
    if plural_ref:
        ref = f"{plural}.{group}" if group else plural
        details_kind = plural
    else:
        ref = f"{kind}.{group}" if group else kind
        details_kind = kind
    # The summary lists each distinct error once (Go's ToAggregate); causes keep duplicates.
    parts = list(dict.fromkeys(f"{field}: {message}" for field, message, _ in causes))
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details = _details(resource, name, details_kind)
    details["causes"] = [
        {"reason": reason, "message": message, "field": field} for field, message, reason in causes
    ]
    return ApiError(422, status(422, "Invalid", f'{ref} "{name}" is invalid: {summary}', details))


def generic_invalid() -> ApiError:
    return ApiError(
        422,
        status(
            422, "Invalid", "the server rejected our request due to an error in our request", {}
        ),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, status(400, "BadRequest", message))


def cannot_handle(kind: str, message: str) -> ApiError:
    return bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: {message}')


def unsupported_media_type(message: str | None = None) -> ApiError:
    if message is None:
        return ApiError(415, status(415, "UnsupportedMediaType", "415: Unsupported Media Type", {}))
    return ApiError(415, status(415, "UnsupportedMediaType", message))


def not_acceptable() -> ApiError:
    return ApiError(
        406,
        status(
            406,
            "NotAcceptable",
            "406: Not Acceptable\n\nAvailable representations: application/json, "
            "application/yaml, application/vnd.kubernetes.protobuf",
            {},
        ),
    )


def forbidden(
    resource: tuple[str, str, str],
    name: str,
    user: str,
    verb: str,
    namespace: str | None,
    *,
    subresource: str = "",
    reason: str = "",
) -> ApiError:
    """RBAC's refusal. A subresource is named ``pods/status`` in the message but the details
    keep the resource; the authorizer's ``reason`` (e.g. a binding's missing Role) is
    appended after a colon."""
    group, plural, _ = resource
    subject = f'{_resource_ref(resource)} "{name}"' if name else _resource_ref(resource)
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    what = f"{plural}/{subresource}" if subresource else plural
    details: JsonObj = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = plural
    return ApiError(
        403,
        status(
            403,
            "Forbidden",
            f'{subject} is forbidden: User "{user}" cannot {verb} resource "{what}" '
            f'in API group "{group}" {scope}' + (f": {reason}" if reason else ""),
            details,
        ),
        {"X-Content-Type-Options": "nosniff"},
    )


def internal_error(message: str) -> ApiError:
    return ApiError(500, status(500, "InternalError", message, {"causes": [{"message": message}]}))


def throttled(retry_after: int | None) -> ApiError:
    """API Priority and Fairness's rejection, as recorded (``recorded/apf.json``): plain text,
    ``Retry-After`` (APF always sends 1; a server shutting down sends more)."""
    headers = {"X-Content-Type-Options": "nosniff"}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    message = "Too many requests, please try again later."
    return ApiError(429, {"message": message}, headers, text=message + "\n")


def expired(message: str) -> JsonObj:
    return status(410, "Expired", message)


# -- times ------------------------------------------------------------------------------------


def now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """metav1.Time: second precision, always ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """metav1.MicroTime: exactly six fractional digits, always ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Go's time.Parse walks the layout element by element and reports the first element the value
# does not match; the server puts that in a 400. The elements of MicroTime's layout:
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_ELEMENTS: tuple[tuple[str, str], ...] = (
    ("2006", r"\d{4}"),
    ("-", "-"),
    ("01", r"\d{2}"),
    ("-", "-"),
    ("02", r"\d{2}"),
    ("T", "T"),
    ("15", r"\d{2}"),
    (":", ":"),
    ("04", r"\d{2}"),
    (":", ":"),
    ("05", r"\d{2}"),
    (".000000", r"\.\d{6}"),
    ("Z07:00", r"Z|[+-]\d{2}:\d{2}"),
)


class TimeParseError(ValueError):
    pass


def parse_micro_time(text: str) -> datetime:
    """Parses a MicroTime exactly as strictly as the server; the error text is Go's."""
    rest = text
    for element, pattern in _MICRO_ELEMENTS:
        match = re.match(pattern, rest)
        if not match:
            raise TimeParseError(
                f'parsing time "{text}" as "{_MICRO_LAYOUT}": cannot parse "{rest}" as "{element}"'
            )
        rest = rest[match.end() :]
    if rest:
        raise TimeParseError(f'parsing time "{text}": extra text: "{rest}"')
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError as exc:
        raise TimeParseError(f'parsing time "{text}": {exc}') from None


_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
)


def parse_time(text: str) -> datetime:
    """metav1.Time accepts RFC 3339 with or without a fraction; the fraction is dropped."""
    match = _RFC3339.match(text)
    if not match:
        raise TimeParseError(
            f'parsing time "{text}" as "2006-01-02T15:04:05Z07:00": cannot parse "{text}" as "2006"'
        )
    base = text[:19] + (match[8] if match[8] != "Z" else "+00:00")
    return datetime.fromisoformat(base).astimezone(UTC)


def human_duration(delta: timedelta) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration, for the Age column."""
    seconds = int(delta.total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rem = seconds % 60
        return f"{minutes}m" if rem == 0 else f"{minutes}m{rem}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        rem = minutes % 60
        return f"{hours}h" if rem == 0 else f"{hours}h{rem}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rem = hours % 24
        return f"{hours // 24}d" if rem == 0 else f"{hours // 24}d{rem}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


# -- names and labels -------------------------------------------------------------------------

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_HELP = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
NAME_PART_HELP = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
LABEL_VALUE_HELP = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.match(name))


def label_key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and not is_subdomain(prefix):
        errors.append("prefix part " + SUBDOMAIN_HELP)
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errors.append(NAME_PART_HELP)
    return errors


def label_value_ok(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def quote(value: Any) -> str:
    """How Go's field errors print a value: strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value)


# -- field order --------------------------------------------------------------------------------

_METADATA_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def ordered(value: JsonObj, order: tuple[str, ...]) -> JsonObj:
    """Known keys in Go struct order, then anything else."""
    out = {key: value[key] for key in order if key in value}
    out.update({key: item for key, item in value.items() if key not in out})
    return out


def ordered_metadata(metadata: JsonObj) -> JsonObj:
    out = ordered(metadata, _METADATA_ORDER)
    for field in ("labels", "annotations"):  # Go maps: encoding/json writes keys sorted
        if isinstance(out.get(field), dict):
            out[field] = dict(sorted(out[field].items()))
    return out


METADATA_FIELDS = frozenset(_METADATA_ORDER)
