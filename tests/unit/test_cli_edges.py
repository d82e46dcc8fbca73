"""Second contact (issue 32): what a newcomer or an operator types wrong gets one line that
names the flag and the fix, never argparse's or urllib's words for something else. Real
processes where the exit status and stderr are the point; `load` where the parse is."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import OPTIONS, load, parse_duration
from sidecar.config_error import ConfigError
from tests.unit.test_config import run_cli

DURATION_FLAGS = [option.flag for option in OPTIONS if option.parse is parse_duration]


def test_there_are_duration_flags_to_check() -> None:
    assert {"--lease-duration", "--renew-interval", "--idle-timeout"} <= set(DURATION_FLAGS)


@pytest.mark.parametrize("flag", DURATION_FLAGS)
def test_a_negative_duration_after_a_space_gets_the_durations_own_message(
    flag: str, tmp_path: Path
) -> None:
    """argparse read ``-5s`` as a flag and said "expected one argument"."""
    with pytest.raises(ConfigError) as caught:
        load([flag, "-5s", "--store", f"sqlite:///{tmp_path}/l.db"], environ={})
    assert str(caught.value) == (
        f"{flag}=-5s: must be a positive duration such as 15, 1.5, 1500ms, 2s or 1m"
    )


def test_a_flag_without_its_value_still_says_so_and_a_negative_number_is_still_a_value(
    tmp_path: Path,
) -> None:
    with pytest.raises(SystemExit):
        load(["--lease-duration", "--listen", "127.0.0.1:0"], environ={})
    config = load(["--priority", "-5", "--store", f"sqlite:///{tmp_path}/l.db"], environ={})
    assert config.priority == -5


def test_status_takes_a_negative_duration_the_same_way(tmp_path: Path) -> None:
    result = run_cli("status", "--store", f"sqlite:///{tmp_path}/l.db", "--lease-duration", "-5s")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "leader-sidecar status: --lease-duration=-5s: must be a positive duration such as 15, "
        "1.5, 1500ms, 2s or 1m"
    ]


@pytest.mark.parametrize(
    ("url", "wanted"),
    [
        (
            "127.0.0.1:4060",
            "http:// is missing; give the sidecar's --listen as a URL, e.g. http://127.0.0.1:4060",
        ),
        ("ftp://127.0.0.1:4060", "must be an http:// URL of the sidecar's --listen"),
        ("\x1b[2J127.0.0.1:1", "http:// is missing"),
    ],
    ids=["no scheme", "another scheme", "an escape sequence"],
)
def test_transfer_names_what_is_wrong_with_its_url_before_sending_anything(
    url: str, wanted: str
) -> None:
    result = run_cli("transfer", "--url", url)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("leader-sidecar transfer: --url=")
    assert wanted in lines[0]
    assert "\x1b" not in result.stderr
    assert "unknown url type" not in result.stderr


@pytest.mark.parametrize("url", ["user:s3cret@127.0.0.1:4060", "ftp://user:s3cret@127.0.0.1"])
def test_transfer_never_prints_a_password_in_a_url_it_refuses(url: str) -> None:
    result = run_cli("transfer", "--url", url)
    assert result.returncode == 2
    assert "s3cret" not in result.stderr
    assert "user:***@127.0.0.1" in result.stderr
