"""docs/configuration.md is the whole list of settings: exactly the flags the sidecar takes."""

from __future__ import annotations

from sidecar.config import OPTIONS
from tests.support.flag_table import table_flags
from tests.support.tools import REPO

PAGE = REPO / "docs" / "configuration.md"


def test_the_configuration_page_names_exactly_the_flags_the_sidecar_takes() -> None:
    """Kept in step with sidecar/config.py OPTIONS: ``--max-long-polls-per-peer`` was once in
    ``--help`` and missing from the list."""
    options = {option.flag for option in OPTIONS}
    table = table_flags(PAGE.read_text())
    assert sorted(options - table) == [], "flags missing from docs/configuration.md"
    assert sorted(table - options) == [], "docs/configuration.md names no such flag"
