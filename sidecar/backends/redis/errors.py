"""Why a request to Redis failed: one line an operator can act on, and how loud to log it."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    NoPermissionError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)

from sidecar.backends.kit.guard import exception_chain

if TYPE_CHECKING:
    from sidecar.backends.redis.target import RedisTarget


def explain(
    exc: BaseException, target: RedisTarget, *, request_timeout: float, holder_key: str
) -> tuple[str, str]:
    """(log level, one-line cause) for an error from redis-py or the socket."""
    text = str(exc) or type(exc).__name__
    chain = exception_chain(exc)
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify is not None or "CERTIFICATE_VERIFY_FAILED" in text:
        reason = verify.verify_message if verify is not None else text
        ca = target.ca_file or "the system CA bundle"
        return "error", (
            f"TLS: the server's certificate failed verification ({reason}); check that "
            f"--redis-ca-file ({ca}) holds the CA that signed it and that the certificate "
            "names the host in --store"
        )
    if "CERTIFICATE_REQUIRED" in text.upper().replace(" ", "_"):
        return "error", (
            f"TLS: the server requires a client certificate ({text}); give "
            "--redis-cert-file and --redis-key-file"
        )
    if any(isinstance(e, ssl.SSLError) for e in chain) or "[SSL" in text:
        return "error", f"TLS handshake failed: {text}"
    if "reset by peer" in text:
        if target.tls:
            # TLS 1.3 checks the client certificate after the handshake: a refusal may
            # arrive as an alert (above) or as a bare reset.
            return "warning", (
                f"{text} (the server closed the TLS connection; if it requires client "
                "certificates, give --redis-cert-file and --redis-key-file)"
            )
        return "warning", f"{text} (if the server only speaks TLS, use rediss://)"
    if isinstance(exc, MasterNotFoundError):
        hint = f"check the master name {target.master_name!r} in --store"
        if "uthenticat" in text or "NOAUTH" in text or "WRONGPASS" in text:
            hint = "the Sentinels refused our credentials: check --redis-sentinel-password"
        return "error", f"no Sentinel named a primary ({text}); {hint}"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return "warning", f"no answer within {request_timeout:g}s ({text})"
    if isinstance(exc, BusyLoadingError):
        return "warning", f"the server is still loading its dataset ({text})"
    if isinstance(exc, ReadOnlyError):
        return "warning", f"the server is a read-only replica, failover in progress? ({text})"
    if isinstance(exc, AuthenticationError | AuthorizationError | NoPermissionError) or (
        text.startswith(("NOAUTH", "WRONGPASS", "NOPERM"))
    ):
        return "error", (
            f"authentication or ACL refused ({text}); check --redis-username and "
            "--redis-password / LEADER_SIDECAR_REDIS_PASSWORD"
        )
    if isinstance(exc, ResponseError) and text.startswith("NOREPLICAS"):
        return "warning", f"too few replicas for the server's min-replicas-to-write ({text})"
    if is_foreign_value(exc):
        return "error", (
            f"unexpected value in {holder_key} ({type(exc).__name__}: {text}); "
            "something else writes to this key"
        )
    return "warning", f"{type(exc).__name__}: {text}"


def is_foreign_value(exc: BaseException) -> bool:
    """A value in our keys that is not ours (our decoding, or cjson in our scripts, failed):
    an answer about the data, not a sign that the server lost anything."""
    return isinstance(exc, ValueError | KeyError | TypeError) or (
        isinstance(exc, ResponseError) and "user_script" in str(exc)
    )
