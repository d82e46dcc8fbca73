"""Reading Markdown the way GitHub renders it: heading anchors and relative links."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
# [text](target) or ![alt](target); the target up to the first space or ")".
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def prose_lines(markdown: str, *, blank_code: bool = True) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; inline code spans blanked unless
    `blank_code` is false (a heading's anchor keeps their text)."""
    fence: str | None = None
    for number, line in enumerate(markdown.splitlines(), start=1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
                continue
            if stripped.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield number, CODE_SPAN.sub("``", line) if blank_code else line


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub generates for headings: lower case, punctuation other than `-` and `_`
    dropped, each space a `-`; a repeated heading gets `-1`, `-2`, … ."""
    anchors: set[str] = set()
    for _, line in prose_lines(markdown, blank_code=False):
        match = HEADING.match(line)
        if not match:
            continue
        text = re.sub(r"[`*]", "", match.group(1)).strip().lower()
        base = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        anchor, n = base, 0
        while anchor in anchors:
            n += 1
            anchor = f"{base}-{n}"
        anchors.add(anchor)
    return anchors


def links(markdown: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline link and image outside code."""
    for number, line in prose_lines(markdown):
        for match in LINK.finditer(line):
            yield number, match.group(1)


def is_external(target: str) -> bool:
    return bool(re.match(r"[a-z][a-z0-9+.-]*:", target, re.I))


def broken_links(page: Path, root: Path) -> list[str]:
    """Every relative link of `page` whose file (inside `root`) or anchor does not exist."""
    broken = []
    text = page.read_text()
    for number, target in links(text):
        if is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{number}: {target}"
        file = (page.parent / path_part).resolve() if path_part else page
        if not file.is_relative_to(root.resolve()):
            broken.append(f"{where} (outside the repository)")
        elif not file.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            broken.append(f"{where} (no heading with that anchor)")
        elif anchor and file.suffix != ".md":
            broken.append(f"{where} (an anchor into a file that is not Markdown)")
    return broken
