"""Text from outside made safe to print: secrets replaced, control characters escaped.

A setting, a store error or a request can carry a password or a newline. A password must not
reach a log, an error message or an API answer; a newline must not split the one-line config
error or forge a log line of its own.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping

HIDDEN = "***"
# Variable names whose values are treated as secrets, misspelt ones included (PASSWROD).
_SECRET_NAME = re.compile(r"PASS|PWD|TOKEN|SECRET|CRED|AUTH", re.IGNORECASE)
# Set by shells and container runtimes to the working directory; "PWD" is no password here,
# and scrubbing it would blank the directory out of every path in every line.
_WORKING_DIRECTORIES = frozenset({"PWD", "OLDPWD"})
MIN_SECRET_CHARS = 4  # shorter values would blank out unrelated text everywhere
# C0, DEL, C1, the Unicode line and paragraph separators, and the invisible format characters
# that reorder or hide text on a terminal (bidirectional overrides and isolates, zero-width
# characters, the byte-order mark): a forged table row needs nothing more.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]"
)


def printable(text: str) -> str:
    """Control characters as escapes (``\\n``, ``\\x1b``, ``\\u2028``, ``\\u202e``): one line, no
    terminal tricks. Everything else is kept as is."""
    return _CONTROL.sub(_escape, text)


def terminal_text(value: object) -> str:
    """``value`` as text safe for an operator's terminal: control characters escaped (see
    `printable`), and bytes that were not UTF-8 (decoded with ``surrogateescape``, or any lone
    surrogate) as ``\\xff`` escapes instead of raw bytes."""
    text = str(value)
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate surrogateescape did not make
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return printable(text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if char in named:
        return named[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


# Where a URL ends inside free text (a log line, an error message).
_URL_END = re.compile(r"[\s\"'<>]")


def redact_url(text: str) -> str:
    """``scheme://user:password@host…`` → ``scheme://user:***@host…``, anywhere in ``text``.

    The password runs to the *last* ``@`` of the URL, so one with an unescaped ``@`` or ``/``
    is hidden whole. One pass over the text (no backtracking pattern): each URL is scanned a
    fixed number of times."""
    if "://" not in text:
        return text
    parts: list[str] = []
    copied = search = 0
    while (scheme_end := text.find("://", search)) != -1:
        begin = scheme_end + 3
        ended = _URL_END.search(text, begin)
        end = ended.start() if ended else len(text)
        at = text.rfind("@", begin, end)
        colon = text.find(":", begin, at) if at != -1 else -1
        if colon != -1:
            parts.append(text[copied : colon + 1])
            parts.append(HIDDEN)
            copied = at
        # A URL may carry a password as a parameter too: ?password=…&sslpassword=…
        query = text.find("?", max(begin, at), end)
        while query != -1:
            name_end = text.find("=", query + 1, end)
            if name_end == -1:
                break
            value_end = text.find("&", name_end, end)
            value_end = end if value_end == -1 else value_end
            if text[query + 1 : name_end] in _SECRET_PARAMETERS and value_end > name_end + 1:
                parts.append(text[copied : name_end + 1])
                parts.append(HIDDEN)
                copied = value_end
            query = value_end if value_end < end else -1
        search = end
    parts.append(text[copied:])
    return "".join(parts)


# URL parameters that hold a secret.
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def url_password(text: str) -> str | None:
    """The password a URL carries (``user:password@``), or None."""
    passwords = url_passwords(text)
    return passwords[0] if passwords else None


def url_passwords(text: str) -> list[str]:
    """Every secret a URL carries: ``user:password@`` and ``?password=`` / ``?sslpassword=``."""
    try:
        parsed = urllib.parse.urlsplit(text)
        found = [urllib.parse.unquote(parsed.password)] if parsed.password else []
        pairs = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
    except ValueError:
        return []
    return found + [value for key, value in pairs if key in _SECRET_PARAMETERS and value]


def secret_values(known: Iterable[str | None], environ: Mapping[str, str]) -> list[str]:
    """Every value to scrub: the given ones (passwords, URLs holding one) and the value of any
    environment variable whose name looks secret."""
    values: set[str] = set()
    for value in known:
        if value and "://" in value:
            values.update(url_passwords(value))  # a URL's passwords, not the whole URL
        elif value:
            values.add(value)
    for name, value in environ.items():
        if looks_secret(name) and name not in _WORKING_DIRECTORIES:
            values.add(value)
    return sorted(v for v in values if len(v) >= MIN_SECRET_CHARS)


class Scrubber:
    """Replaces known secret values, also as they appear inside a JSON string."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms = set()
        for secret in secrets:
            forms.add(secret)
            forms.add(json.dumps(secret)[1:-1])
            forms.add(urllib.parse.quote(secret, safe=""))
        # Longest first, so a secret containing another is replaced whole.
        self._forms = sorted((f for f in forms if f), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, HIDDEN)
        return redact_url(text)
