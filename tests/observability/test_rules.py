"""The Prometheus rule file: valid for promtool, its unit tests pass, and every alert is
complete (severity, summary, description with values, a runbook section that exists in
docs/operations.md) and tested both where it fires and where it must stay silent."""

from __future__ import annotations

import re
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.observability.promql import (
    REPO,
    RULES,
    alerting_rules,
    exported_series_names,
    metric_names,
)
from tests.support.markdown import github_anchors
from tests.support.tools import require_binary

RULE_TESTS = Path(__file__).with_name("rules.test.yaml")
RUNBOOKS = "docs/operations.md"
# Where the runbooks open from Alertmanager by default (the chart's prometheusRule.runbooksUrl
# moves them): the project's docs/operations.md on GitHub.
RUNBOOKS_URL = f"https://github.com/leader-sidecar/leader-sidecar/blob/main/{RUNBOOKS}"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


def test_promtool_accepts_the_rule_file() -> None:
    """``promtool check rules``: valid YAML, PromQL and templates, no duplicate names."""
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in result.stdout


def test_the_promtool_unit_tests_of_the_rules_pass() -> None:
    """``promtool test rules``: each alert fires, with these labels and rendered annotations,
    exactly in the cases the test file says, and stays silent in the others."""
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    """The test file has, for every alert, a case where it fires and one where it must not."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    silent: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {rule["alert"] for rule in alerting_rules()}
    assert names - fired == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested silent"


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_says_how_bad_what_and_where_to_look(rule: dict[str, Any]) -> None:
    """Severity, a summary naming the lease (or, where the series is one of a lease group's,
    the group), a description with the values, a runbook URL."""
    assert rule["alert"].startswith("LeaderSidecar")
    assert rule["labels"]["severity"] in ("warning", "critical")
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    for text in (annotations["summary"], annotations["description"]):
        assert re.search(r"\$labels\.lease\b", text) or "$labels.lease_group" in text
    assert "$value" in annotations["summary"] + annotations["description"]
    assert annotations["runbook_url"] == f"{RUNBOOKS_URL}#{rule['alert'].lower()}"


def test_every_runbook_link_is_absolute_and_points_at_a_section_of_the_runbooks_page() -> None:
    """An absolute https URL (a relative one opens nothing from Alertmanager, Slack or a
    pager), ending in docs/operations.md, whose anchor is a section there, one per alert."""
    anchors = github_anchors((REPO / RUNBOOKS).read_text())
    for rule in alerting_rules():
        url = urlsplit(rule["annotations"]["runbook_url"])
        assert (url.scheme, bool(url.netloc)) == ("https", True), rule["alert"]
        assert url.path.endswith("/" + RUNBOOKS), rule["alert"]
        assert url.fragment in anchors, f"{RUNBOOKS} has no section for {rule['alert']}"


def test_the_rules_read_only_metrics_the_sidecar_exports() -> None:
    """A renamed metric would silence an alert without any error: every name in an
    expression must be one the sidecar exports."""
    exported = exported_series_names()
    for rule in alerting_rules():
        used = metric_names(rule["expr"])
        assert used, rule["alert"]
        assert used <= exported, (rule["alert"], used - exported)


def test_the_rule_file_ships_inside_the_package() -> None:
    """The chart and users find it next to the code: ``sidecar/prometheus/rules.yaml``."""
    shipped = resources.files("sidecar").joinpath("prometheus", "rules.yaml")
    assert shipped.is_file()
    assert yaml.safe_load(shipped.read_text())["groups"]
