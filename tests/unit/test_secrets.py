"""Secrets never reach output, logs, metrics or errors, and no setting can forge a log line
(issue 12, items 6 and 8)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from sidecar import logs
from sidecar.redact import Scrubber, printable, redact_url, secret_values
from tests.unit.test_config import run_cli

SECRET = "s3cret-Pa55"
FORGED = '{"ts":"2026-11-30T00:00:00.000Z","level":"error","msg":"forged"}'


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["--store", f"redis://user:{SECRET}@host:99999/0"], {}, id="redis URL"),
        pytest.param(
            ["--store", f"redis+sentinel://:{SECRET}@h:70000/mymaster"], {}, id="sentinel URL"
        ),
        pytest.param(
            [], {"LEADER_SIDECAR_STORE": f"rediss://u:{SECRET}@h:0/0"}, id="URL in the env"
        ),
        pytest.param([], {"LEADER_SIDECAR_REDIS_PASSWROD": SECRET}, id="misspelt variable"),
        pytest.param([], {"LEADER_SIDECAR_API_TOKEN": SECRET}, id="unknown token variable"),
    ],
)
def test_a_config_error_never_prints_a_password(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    result = run_cli(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("leader-sidecar: ")


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param([], {"LEADER_SIDECAR_LEASE_DURATION": "1s\n" + FORGED}, id="env value"),
        pytest.param(["--lease", "x\r\n" + FORGED], {}, id="flag value"),
        pytest.param([], {"LEADER_SIDECAR_LEASE_DURATON\n" + FORGED: "3"}, id="env name"),
    ],
)
def test_a_newline_in_a_setting_cannot_split_the_one_line_error(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    result = run_cli(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "\\n" in lines[0]


def test_url_passwords_are_redacted_and_the_rest_is_kept() -> None:
    assert redact_url(f"redis://user:{SECRET}@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url(f"redis+sentinel://:{SECRET}@a:1,b:2/m") == "redis+sentinel://:***@a:1,b:2/m"
    assert redact_url("redis://u:p@ss/w0rd@host:1/0") == "redis://u:***@host:1/0"  # unescaped
    assert redact_url('{"e":"to redis://u:pw@h:1 failed"}') == '{"e":"to redis://u:***@h:1 failed"}'
    assert redact_url("sqlite:///./x.db") == "sqlite:///./x.db"
    assert redact_url("not a url") == "not a url"


def test_url_redaction_takes_linear_time_on_hostile_text() -> None:
    started = time.perf_counter()
    redact_url("a://" + "b:" * 100_000)
    redact_url("://b:@" * 30_000)
    assert time.perf_counter() - started < 0.5


def test_control_characters_are_escaped() -> None:
    assert printable("a\nb\r\x1b[31m\u2028\x00") == "a\\nb\\r\\x1b[31m\\u2028\\x00"
    assert printable("plain: ünïcode") == "plain: ünïcode"


def test_secret_values_come_from_the_config_and_secret_looking_variables() -> None:
    environ = {
        "LEADER_SIDECAR_REDIS_PASSWROD": "misspelt-value",
        "KUBE_TOKEN": "token-value",
        "LEADER_SIDECAR_LEASE": "not-a-secret",
        "SHORT_PASSWORD": "ab",  # too short to scrub without mangling every line
    }
    known = [f"redis://u:{SECRET}@h:1/0", "sqlite:///./no-password.db", "other-secret", None]
    found = secret_values(known, environ)
    assert set(found) == {SECRET, "other-secret", "misspelt-value", "token-value"}


def test_the_working_directory_is_not_taken_for_a_password() -> None:
    """``PWD`` holds the shell's working directory: scrubbed, every path under it read
    ``***/ca.pem`` in the errors a user needs to read."""
    environ = {"PWD": "/etc/leader-sidecar", "OLDPWD": "/tmp", "DB_PWD": "real-password"}
    assert secret_values([], environ) == ["real-password"]


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_log_lines_scrub_secrets_and_stay_one_line(
    log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(log_format, "info", scrub=Scrubber([SECRET]))
    try:
        logger = logging.getLogger("sidecar.test")
        logs.log(logger, "warning", f"store said {SECRET}", error=f"auth {SECRET}\n{FORGED}")
        try:
            raise RuntimeError(f"password {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logs.configure("json", "info")
    err = capsys.readouterr().err
    assert SECRET not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    if log_format == "json":
        assert all(json.loads(line)["level"] in ("warning", "error") for line in lines)
