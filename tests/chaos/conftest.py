"""One seed per session (printed in the header and in every run's output) and a one-line
verdict per store at the end of the session."""

from __future__ import annotations

import pytest

from tests.chaos.schedule import base_seed
from tests.chaos.verdicts import VERDICTS

SEED = base_seed()


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    return SEED


def pytest_report_header(config: pytest.Config) -> str:
    return f"chaos: CHAOS_SEED={SEED} (set it to replay this schedule)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not VERDICTS:
        return
    terminalreporter.section("chaos verdicts")
    for store, lines in VERDICTS.items():
        overall = (
            "PASS" if all(line.split(": ", 1)[1].startswith("PASS") for line in lines) else "FAIL"
        )
        terminalreporter.write_line(f"{store}: {overall} — " + " | ".join(lines))
