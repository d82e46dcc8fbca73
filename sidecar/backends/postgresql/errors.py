"""Why a request to PostgreSQL failed: one line an operator can act on, and how loud to log it."""

from __future__ import annotations

import ssl

import asyncpg

from sidecar.backends.kit.guard import exception_chain
from sidecar.backends.postgresql.schema import SCHEMA


def explain(exc: BaseException, *, request_timeout: float, tls: bool) -> tuple[str, str]:
    """(log level, one-line cause) for an error from asyncpg, the socket or TLS."""
    text = str(exc) or type(exc).__name__
    chain = exception_chain(exc)
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify is not None:
        return "error", (
            f"TLS: the server's certificate failed verification ({verify.verify_message}); "
            "check that ?sslrootcert= holds the CA that signed it and that the certificate "
            "names the host in --store (sslmode=verify-full)"
        )
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return "error", f"TLS handshake failed: {text}"
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return "error", (
            f"authentication refused ({text}); check the user in --store and the password "
            "(in the URL, PGPASSWORD or the password file)"
        )
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return "error", (
            f"permission denied ({text}); the role needs the privileges in docs/postgresql.md "
            f"(`leader-sidecar postgresql-schema --grant ROLE` grants them)"
        )
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
        return "error", (
            f"the {SCHEMA} schema is missing or incomplete ({text}); a role that may create "
            f"it runs `leader-sidecar postgresql-schema --store URL` once"
        )
    if isinstance(exc, asyncpg.QueryCanceledError):
        return "warning", (
            f"the statement did not finish within the request timeout ({text}): a lock held "
            "elsewhere (a long app transaction that passed the fence holds a new grant back), "
            "or an overloaded server"
        )
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return "warning", (
            f"the server is a read-only standby ({text}); with several hosts in --store, "
            "keep target_session_attrs=read-write"
        )
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return "warning", f"the server refused a connection: too many connections ({text})"
    if isinstance(exc, asyncpg.CannotConnectNowError):
        return "warning", f"the server is starting up, shutting down or in recovery ({text})"
    if isinstance(exc, TimeoutError):
        return "warning", f"no answer within {request_timeout:g}s"
    if isinstance(exc, ConnectionRefusedError) and not tls:
        return "warning", f"{text} (is the server running, and is the port right?)"
    if isinstance(exc, asyncpg.PostgresError):
        code = getattr(exc, "sqlstate", "")
        return "warning", f"{type(exc).__name__} ({code}): {text}"
    return "warning", f"{type(exc).__name__}: {text}"


def session_may_be_lost(exc: BaseException) -> bool:
    """Whether the failure may mean the session is gone (and with it, possibly, the server we
    saw: a restart, a failover, a restore): a socket error, a closed connection, SQLSTATE class
    08 (connection exception) or 57P (the server shutting down, a terminated backend). Not a
    timeout (the session lives on), not an error a live session answered (a statement timeout,
    a missing privilege), not a row that is not ours (our decoding failed)."""
    if isinstance(exc, TimeoutError | ValueError | KeyError | TypeError):
        return False
    if isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", "") or "").startswith(("08", "57P"))
    return True
