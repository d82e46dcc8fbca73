"""The three patch kinds the API server accepts on built-in types, as far as our objects need:
JSON merge patch (RFC 7386), strategic merge patch (the same for maps and scalars; lists of
our objects are never patched), and JSON patch (RFC 6902, with the server's lenient
``replace`` of a missing key)."""

from __future__ import annotations

import copy
from typing import Any

from tests.fakekube.wire import generic_invalid


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """For maps and scalars strategic merge equals merge patch; ``$patch``/``$retainKeys``
    directives are dropped (nothing we serve needs them)."""
    if isinstance(patch, dict):
        patch = {key: value for key, value in patch.items() if not key.startswith("$")}
    return merge_patch(target, patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise generic_invalid()
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise generic_invalid()
    return node, parts[-1]


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 test/add/replace/remove/copy/move; a failed op is a generic 422."""
    if not isinstance(ops, list):
        raise generic_invalid()
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise generic_invalid()
        parts = _pointer(op["path"])
        if not parts:
            raise generic_invalid()
        kind = op["op"]
        if kind == "test":
            node, key = _parent(doc, parts)
            actual = node.get(key) if isinstance(node, dict) else None
            if actual != op.get("value"):
                raise generic_invalid()
        elif kind in ("add", "replace"):
            node, key = _parent(doc, parts)
            if isinstance(node, dict):
                node[key] = copy.deepcopy(op.get("value"))  # replace of a missing key adds it
            elif isinstance(node, list):
                index = len(node) if key == "-" else int(key)
                if kind == "add":
                    node.insert(index, copy.deepcopy(op.get("value")))
                else:
                    node[index] = copy.deepcopy(op.get("value"))
            else:
                raise generic_invalid()
        elif kind == "remove":
            node, key = _parent(doc, parts)
            if isinstance(node, dict) and key in node:
                del node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                del node[int(key)]
            else:
                raise generic_invalid()
        elif kind in ("copy", "move"):
            source = _pointer(op.get("from", ""))
            node, key = _parent(doc, source)
            if not isinstance(node, dict) or key not in node:
                raise generic_invalid()
            value = copy.deepcopy(node[key])
            if kind == "move":
                del node[key]
            dest, dkey = _parent(doc, parts)
            if not isinstance(dest, dict):
                raise generic_invalid()
            dest[dkey] = value
        else:
            raise generic_invalid()
    return doc
