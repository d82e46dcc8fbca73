"""The one error a bad setting raises, wherever it is checked: the configuration, a store's
own checks, a listen address. Its own module, so that stores raise it without importing the
configuration."""

from __future__ import annotations

from sidecar.redact import looks_secret, printable, redact_url


class ConfigError(Exception):
    """A bad setting. ``str()`` is the one line printed before exiting with status 2."""

    def __init__(self, source: str, value: object, allowed: str) -> None:
        # The value may be a URL with a password or carry a newline that would forge a second
        # line: show it redacted and escaped, or not at all for a secret-looking setting.
        shown = "(hidden)" if looks_secret(source) else redact_url(str(value))
        setting = f"{source}={shown}" if value != "" else source
        self.allowed = allowed
        super().__init__(printable(f"{setting}: {allowed}"))
