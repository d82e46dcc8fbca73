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


def test_the_readme_configuration_names_only_flags_the_sidecar_takes() -> None:
    """The README shows a few flags; the whole list is docs/configuration.md's, tested there."""
    from sidecar.config import OPTIONS
    from tests.support.flag_table import table_flags

    text = section(README.read_text(), "Configuration")
    assert sorted(table_flags(text) - {option.flag for option in OPTIONS}) == []
    assert "docs/configuration.md" in text


def test_the_quick_start_names_the_venv_step_and_what_the_public_port_serves() -> None:
    text = section(README.read_text(), "Quick start")
    first_block = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert first_block is not None
    commands = first_block.group(1).splitlines()
    assert commands[0].startswith("python3 -m venv ")
    assert commands[1] == "pip install . && leader-sidecar"
    prose = " ".join(text.split())
    assert "`0.0.0.0:4041` (`--public-listen`)" in prose.replace("**", "")
    assert "serves `/leader`, `/metrics` and the probes" in prose


def test_the_three_copies_show_what_a_newcomer_will_see() -> None:
    """A follower's answer, and how long each way of stopping the leader takes."""
    text = section(README.read_text(), "Quick start")
    assert '$ curl -s 127.0.0.1:4050/leader\n{"leader": false, ' in text
    assert '"holder": "vm_61bf7a33", "term": 1' in text  # the first copy, from the first answer
    prose = " ".join(text.split())
    assert re.search(
        r"`kill -9` the leader: .* one lease after the dead leader's last renewal "
        r"\(15 s by default; 15\.\d+ s when we tried\)",
        prose,
    )
    assert re.search(r"`kill -TERM` it instead: another copy leads \d+\u2013\d+ ms later", prose)
