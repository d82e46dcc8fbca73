"""The flags named in the first column of a Markdown table of flags."""

from __future__ import annotations

import re


def table_flags(markdown: str) -> set[str]:
    """Every ``--flag`` in the first column of the table rows, ``--etcd-{ca,cert}-file``
    expanded as a shell would."""
    flags: set[str] = set()
    for line in markdown.splitlines():
        if not line.startswith("| `--"):
            continue
        for token in re.findall(r"--[a-z0-9{},-]+", line.split("|")[1]):
            braces = re.search(r"\{([^}]*)\}", token)
            if braces is None:
                flags.add(token)
                continue
            for part in braces.group(1).split(","):
                flags.add(token[: braces.start()] + part + token[braces.end() :])
    return flags
