"""Every relative link and anchor in the documentation resolves, the way GitHub renders it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.markdown import broken_links, github_anchors, links
from tests.support.tools import REPO


def pages() -> list[Path]:
    return sorted(
        [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "charts").rglob("README.md")]
    )


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    """A moved section or a renamed heading breaks no link."""
    assert broken_links(page, REPO) == []


def test_the_pages_checked_include_the_manuals_and_the_chart_readme() -> None:
    names = {str(p.relative_to(REPO)) for p in pages()}
    assert {"README.md", "docs/operations.md", "charts/leader-sidecar/README.md"} <= names


def test_anchors_follow_githubs_rules() -> None:
    """Punctuation dropped, spaces to dashes, repeats numbered, code blocks ignored."""
    markdown = (
        "# What it guarantees — and what it cannot\n"
        "## `--redis-min-replicas` and failover\n"
        "## Notes\n## Notes\n"
        "```sh\n# not a heading\n```\n"
    )
    assert github_anchors(markdown) == {
        "what-it-guarantees--and-what-it-cannot",
        "--redis-min-replicas-and-failover",
        "notes",
        "notes-1",
    }


def test_the_checker_reports_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Present\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n[ok](other.md#present) [self](#top) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [bad anchor](other.md#absent) `[in code](nowhere.md)`\n"
    )
    assert [line.split(": ", 1)[1] for line in broken_links(page, tmp_path)] == [
        "missing.md (no such file)",
        "other.md#absent (no heading with that anchor)",
    ]
    assert [target for _, target in links(page.read_text())][:2] == ["other.md#present", "#top"]
