"""The chart README documents every value (a value nobody can find is a value nobody sets)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.chart.helm import CHART


def documented() -> set[str]:
    """Value paths named in the README's values table. A row may name several: `a.b`, `.c`
    means a.b and a.c."""
    names: set[str] = set()
    table = (CHART / "README.md").read_text().split("## Values", 1)[1]
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first_cell = row.split("|")[1]
        parent = ""
        for name in re.findall(r"`([^`]+)`", first_cell):
            if name.startswith("."):
                names.add(parent + name)
            else:
                names.add(name)
                parent = name.rpartition(".")[0]
    return names


def leaves(value: Any, path: str = "") -> list[str]:
    if isinstance(value, dict) and value:
        return [
            leaf
            for key, child in value.items()
            for leaf in leaves(child, f"{path}.{key}".lstrip("."))
        ]
    return [path]


def test_every_value_is_in_the_readme_table() -> None:
    """Each leaf of values.yaml, or a map above it (e.g. `resources`), has a row."""
    names = documented()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []
    for leaf in leaves(values):
        parts = leaf.split(".")
        if not any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1)):
            missing.append(leaf)
    assert missing == []


def test_the_readme_table_names_no_value_that_does_not_exist() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name in documented():
        node: Any = values
        for part in name.split("."):
            assert isinstance(node, dict), f"README names {name} below a leaf"
            assert part in node, f"README names {name}, values.yaml does not have it"
            node = node[part]
