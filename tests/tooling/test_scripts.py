"""The repository's shell scripts work on a fresh machine on the first try: no pipeline that
fails at random under pipefail, and scripts/fetch-tools works with nothing cached."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.tools import REPO
from tests.tooling.shell_pipelines import early_exit_pipelines, shell_scripts, uses_pipefail


def test_the_scan_finds_the_scripts_that_ci_runs() -> None:
    """The scan is not vacuous: it sees .ci/run and every script in scripts/ written in shell."""
    names = {str(p.relative_to(REPO)) for p in shell_scripts(REPO)}
    assert {".ci/run", "scripts/fetch-tools", "scripts/setup-test-env"} <= names


def test_the_scan_flags_the_line_that_broke_fresh_machines() -> None:
    """The pipeline of issue 13, and its relatives, are caught; safe uses are not."""
    flagged = [
        '"$BIN/kubectl" version --client 2>/dev/null | head -1',
        "dpkg -l | grep -q redis",
        "ps aux | grep -m1 redis",
        "git log | read -r first",
        "ls | sed -n 1q",
        "yes | awk '{ exit }'",
    ]
    safe = [
        "# never `kubectl version | head -1` under pipefail",
        "grep -q redis /etc/services",
        "ps aux | grep redis | wc -l",
        'head -1 "$file"',
    ]
    for line in flagged:
        assert list(early_exit_pipelines(line)), line
    for line in safe:
        assert not list(early_exit_pipelines(line)), line


def test_the_reader_that_leaves_early_really_fails_the_pipeline_under_pipefail() -> None:
    """Why the rule exists: the writer dies of SIGPIPE and pipefail reports 141."""
    result = subprocess.run(
        ["bash", "-c", "set -o pipefail; yes | head -1 >/dev/null"], check=False, timeout=10
    )
    assert result.returncode == 141


def test_no_script_pipes_into_a_reader_that_may_leave_early_under_pipefail() -> None:
    """`| head`, `| grep -q`, `| read`… under pipefail fail at random (exit 141)."""
    offenders = [
        f"{script.relative_to(REPO)}:{number}: {line}"
        for script in shell_scripts(REPO)
        if uses_pipefail(text := script.read_text())
        for number, line in early_exit_pipelines(text)
    ]
    assert offenders == [], "capture the output in a variable first:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_fetch_tools_works_with_nothing_cached(tmp_path: Path) -> None:
    """scripts/fetch-tools into an empty folder, as on a fresh machine: exit 0, both tools
    there and running (pip's own HTTP cache may make the download quick; the rest is fresh)."""
    tools = tmp_path / "bin"
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "fetch-tools")],
        env={**os.environ, "LEADER_SIDECAR_TOOLS_BIN": str(tools)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in tools.iterdir()) == ["helm", "kubectl"]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("v3."), lines
    assert lines[1].startswith("Client Version: v1."), lines
