"""``scripts/check-safety-tests`` removes each safety rule from a clone and expects a test to
fail. A removal whose text is no longer in the code removes nothing and reports STALE only
when someone runs the script (minutes); this checks every one of them in milliseconds, so an
edit that moves a rule's code breaks the suite instead of the proof. It also keeps the script
and the contract, docs/design.md, in step: every rule there names its removals and the tests
that catch them, and every removal of the script is named there."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from tests.support.tools import REPO

DESIGN = REPO / "docs" / "design.md"
RULE_HEADING = re.compile(r"^### Rule (\d+): ", re.MULTILINE)
# A row of a proof table: | `removal name` | `tests/…::test_name` |
PROOF_ROW = re.compile(r"^\| `([^`]+)` \| `(tests/[^`:]+)::(\w+)` \|$", re.MULTILINE)


def load_script() -> ModuleType:
    path = REPO / "scripts" / "check-safety-tests"
    loader = importlib.machinery.SourceFileLoader("check_safety_tests", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_removal_still_finds_the_code_it_removes() -> None:
    script = load_script()
    stale = []
    for rule, edits in script.REMOVALS.items():
        texts: dict[str, str] = {}
        for path, old, new in edits:
            text = texts.setdefault(path, (REPO / path).read_text())
            if old not in text:
                stale.append(f"{rule}: {path}: {old[:60]!r}")
                break
            texts[path] = text.replace(old, new, 1)
    assert stale == []
    assert len(script.REMOVALS) >= 40  # the scan is not vacuous


def design_rules(text: str) -> dict[int, list[tuple[str, str, str]]]:
    """Rule number → the (removal, test file, test name) rows of its section in design.md."""
    sections = RULE_HEADING.split(text)
    rules: dict[int, list[tuple[str, str, str]]] = {}
    for number, body in zip(sections[1::2], sections[2::2], strict=True):
        body = body.split("\n## ", 1)[0]  # up to the next top-level section
        rules[int(number)] = PROOF_ROW.findall(body)
    return rules


def test_every_rule_of_the_design_has_a_removal() -> None:
    """Rules 1 to 8 of docs/design.md each list at least one removal of the script, under their
    own number, and each removal listed exists in the script."""
    script = load_script()
    rules = design_rules(DESIGN.read_text())
    assert sorted(rules) == list(range(1, 9))
    for number, rows in rules.items():
        assert rows, f"rule {number} of docs/design.md names no removal"
        for removal, _path, _test in rows:
            assert removal.startswith(f"{number}: "), f"rule {number} lists {removal!r}"
            assert removal in script.REMOVALS, f"rule {number}: no such removal {removal!r}"


def test_every_removal_of_the_script_is_in_the_design() -> None:
    """A removal added to the script without a line in docs/design.md (or one listed twice)
    fails here: the contract names every proof."""
    script = load_script()
    listed = [removal for removal, _path, _test in PROOF_ROW.findall(DESIGN.read_text())]
    assert sorted(listed) == sorted(script.REMOVALS)


def test_every_test_the_design_names_exists() -> None:
    rows = PROOF_ROW.findall(DESIGN.read_text())
    assert len(rows) >= 40  # the scan is not vacuous
    for removal, path, test in rows:
        file = REPO / path
        assert file.is_file(), f"{removal}: {path}"
        assert re.search(rf"^(async )?def {test}\(", file.read_text(), re.MULTILINE), (
            f"{removal}: no {test} in {path}"
        )


def test_the_design_parser_reads_rules_and_rows() -> None:
    text = (
        "### Rule 1: one\n\n| removal | test |\n|---|---|\n"
        "| `1: a` | `tests/x.py::test_a` |\n| `1: b` | `tests/y.py::test_b` |\n"
        "### Rule 2: two\n\nno table\n\n## Other\n\n| `11: c` | `tests/z.py::test_c` |\n"
    )
    assert design_rules(text) == {
        1: [("1: a", "tests/x.py", "test_a"), ("1: b", "tests/y.py", "test_b")],
        2: [],
    }


def test_every_removal_with_tests_of_its_own_names_existing_files() -> None:
    script = load_script()
    for rule, args in script.TESTS.items():
        assert rule in script.REMOVALS, rule
        paths = [a for a in args if a.startswith("tests/")]
        assert paths, rule
        for path in paths:
            assert Path(REPO / path).exists(), f"{rule}: {path}"
