"""README.md is the front page: short, the sections a newcomer looks for, the test command CI
really runs, and a link to every manual in docs/."""

from __future__ import annotations

import re

from tests.support.markdown import links
from tests.support.tools import REPO

README = REPO / "README.md"
CI = REPO / ".ci" / "run"


def section(markdown: str, heading: str) -> str:
    """The text under a `## heading` up to the next `## `."""
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def readme_test_command() -> str:
    text = section(README.read_text(), "Development and tests")
    block = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert block, "no sh block in 'Development and tests'"
    return block.group(1).strip()


def test_the_readme_is_a_front_page_not_a_manual() -> None:
    """At most ~20,000 characters; the manuals live in docs/."""
    assert len(README.read_text()) <= 20_000


def test_the_readme_has_what_a_newcomer_looks_for() -> None:
    headings = re.findall(r"^## (.+)$", README.read_text(), re.M)
    for wanted in (
        "Quick start",
        "What it guarantees — and what it cannot",
        "The localhost API",
        "Configuration",
        "Development and tests",
        "Documentation",
    ):
        assert wanted in headings


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """What a newcomer types is what CI proves works."""
    assert readme_test_command() == "scripts/setup-test-env && python3 -m pytest"
    commands = [
        line.strip()
        for line in CI.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == readme_test_command()


def test_the_readme_says_how_long_the_tests_take() -> None:
    text = section(README.read_text(), "Development and tests")
    assert re.search(r"\d+ minutes", text)


def test_the_readme_links_every_manual_in_docs() -> None:
    targets = {target.partition("#")[0] for _, target in links(README.read_text())}
    for page in (REPO / "docs").glob("*.md"):
        assert f"docs/{page.name}" in targets, f"README.md does not link docs/{page.name}"
