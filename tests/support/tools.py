"""Finding the real tools the tests drive (redis-server, promtool, helm, kubectl, …)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO / ".tools" / "bin"


def find_binary(name: str) -> str | None:
    """On PATH, or in .tools/bin where scripts/fetch-tools puts helm and kubectl."""
    found = shutil.which(name)
    if found:
        return found
    local = TOOLS_BIN / name
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


def require_binary(name: str) -> str:
    """The tool's path. Missing: skip on a developer machine, fail in CI (``CI=true``), where
    scripts/setup-test-env must have installed it."""
    path = find_binary(name)
    if path is None:
        message = f"{name} is not installed; run scripts/setup-test-env"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
