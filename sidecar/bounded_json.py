"""JSON from outside, parsed in bounded depth.

CPython's parser recurses once per nesting level: a body of ``[[[[…`` a thousand deep raised
RecursionError inside it, which escaped as a 500 with a 1.8 KB traceback in the log, per
request. `loads` measures the nesting first, in one pass over the text and
constant memory, and refuses a document deeper than it may be before the parser sees it.
"""

from __future__ import annotations

import json
from typing import Any

_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


class TooDeep(ValueError):
    """The document nests deeper than allowed; ``str()`` says how deep it may be."""


def loads(raw: bytes, max_depth: int) -> Any:
    """``json.loads(raw)``, refusing with `TooDeep` a document nested deeper than
    ``max_depth`` (an object of strings is 1 deep). Raises ValueError for anything that is not
    JSON (UnicodeDecodeError included)."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > max_depth:
                raise TooDeep(f"it may nest at most {max_depth} levels deep")
        elif byte in _CLOSE:
            depth -= 1
    try:
        return json.loads(raw)
    except RecursionError:  # (cannot happen within the depth checked; never a traceback)
        raise TooDeep(f"it may nest at most {max_depth} levels deep") from None
