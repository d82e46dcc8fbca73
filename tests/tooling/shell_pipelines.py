"""Finding pipelines that fail at random under ``set -o pipefail``.

A reader that stops early (``head``, ``grep -q``, ``read``, ``sed q``) closes the pipe while
the writer may still have output; the writer then dies of SIGPIPE (status 141) and pipefail
makes that the pipeline's status. Whether the writer had more to write when the reader left is
a race: such a line passes for months on one machine and fails on the next (issue 13: the
first run of ``scripts/fetch-tools`` on a fresh machine).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

# `| head`, `| grep -q/-m/--quiet/--max-count`, `| read`, `| sed [-n] '…q'`, `| awk '…exit…'`.
EARLY_EXIT_READER = re.compile(
    r"\|\s*("
    r"head\b"
    r"|grep\s+(?:\S+\s+)*?(?:-\w*[qm]\w*|--quiet|--silent|--max-count)\b"
    r"|read\b"
    r"|sed\s+(?:-n\s+)?['\"]?\d*q\b"
    r"|awk\b.*\bexit\b"
    r")"
)
PIPEFAIL = re.compile(r"^\s*set\b.*\bpipefail\b", re.M)
SHELL_SHEBANG = re.compile(r"^#!.*\b(?:ba|da|z)?sh\b")


def is_shell_script(path: Path) -> bool:
    if path.suffix in (".sh", ".bash"):
        return True
    try:
        with path.open("rb") as handle:
            first = handle.readline(200).decode("utf-8", "replace")
    except OSError:
        return False
    return bool(SHELL_SHEBANG.match(first))


def uses_pipefail(text: str) -> bool:
    return bool(PIPEFAIL.search(text))


def early_exit_pipelines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every pipeline into a reader that may stop reading early.
    Comment lines are skipped: they may name the pattern to warn against it."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        if EARLY_EXIT_READER.search(line):
            yield number, line.strip()


def shell_scripts(repo: Path) -> list[Path]:
    """The repository's shell scripts: scripts/, .ci/ and any *.sh outside tool folders."""
    found = {p for folder in ("scripts", ".ci") for p in (repo / folder).glob("*") if p.is_file()}
    skip = {".git", ".tools", ".venv", "node_modules"}
    found |= {p for p in repo.rglob("*.sh") if not skip & set(p.relative_to(repo).parts)}
    return sorted(p for p in found if is_shell_script(p))
