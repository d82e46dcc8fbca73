"""The TLS files a store's settings name, loaded at start-up, so that a wrong file stops the
sidecar naming its setting instead of failing every connection later."""

from __future__ import annotations

import ssl

from sidecar.config_error import ConfigError


class TlsFileError(Exception):
    """A CA bundle, or a certificate and its key, that do not load; ``str()`` says why."""


def ca_context(ca_file: str | None) -> ssl.SSLContext:
    """A client context trusting ``ca_file``, or the system's CAs when None."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsFileError(f"cannot be loaded as PEM CA certificates: {exc}") from None


def load_pair(
    context: ssl.SSLContext, cert_file: str, key_file: str | None, password: str | None = None
) -> None:
    """``cert_file`` and ``key_file`` into ``context``; `TlsFileError` naming the cause."""
    try:
        context.load_cert_chain(cert_file, key_file, password=password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsFileError(str(exc)) from None


def flags_context(
    store: str, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> ssl.SSLContext:
    """The context of a store whose TLS files are flags: ``--STORE-ca-file``,
    ``--STORE-cert-file`` and ``--STORE-key-file``; a `ConfigError` names the flag."""
    try:
        context = ca_context(ca_file)
    except TlsFileError as exc:
        raise ConfigError(f"--{store}-ca-file", ca_file, str(exc)) from None
    if cert_file:
        try:
            load_pair(context, cert_file, key_file)
        except TlsFileError as exc:
            raise ConfigError(
                f"--{store}-cert-file",
                cert_file,
                f"cannot be loaded with --{store}-key-file={key_file} as a PEM certificate and "
                f"its private key: {exc}",
            ) from None
    return context
