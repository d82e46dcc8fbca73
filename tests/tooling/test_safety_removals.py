"""``scripts/check-safety-tests`` removes each safety rule from a clone and expects a test to
fail. A removal whose text is no longer in the code removes nothing and reports STALE only
when someone runs the script (minutes); this checks every one of them in milliseconds, so an
edit that moves a rule's code breaks the suite instead of the proof."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

from tests.support.tools import REPO


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


def test_every_rule_of_the_design_has_a_removal() -> None:
    """Rules 1 to 8 of DESIGN.md each name at least one removal (by its number)."""
    script = load_script()
    numbers = {rule.split(":", 1)[0] for rule in script.REMOVALS}
    assert {str(n) for n in range(1, 9)} <= numbers


def test_every_removal_with_tests_of_its_own_names_existing_files() -> None:
    script = load_script()
    for rule, args in script.TESTS.items():
        assert rule in script.REMOVALS, rule
        paths = [a for a in args if a.startswith("tests/")]
        assert paths, rule
        for path in paths:
            assert Path(REPO / path).exists(), f"{rule}: {path}"
