"""Fixtures for the chart tests: one isolated Helm home per session."""

from __future__ import annotations

import pytest

from tests.chart.helm import Helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm.create(tmp_path_factory.mktemp("helm-home"))
