"""Starts the image build in the background once the image tests are known to run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.image.background import BackgroundBuild, tools_present, wanted

BUILD_KEY = pytest.StashKey[BackgroundBuild]()


def pytest_collection_finish(session: pytest.Session) -> None:
    selected = any(item.path.name == "test_image.py" for item in session.items)
    if selected and wanted(session.config) and tools_present():
        build = BackgroundBuild()
        session.config.stash[BUILD_KEY] = build
        build.start()


@pytest.fixture(scope="session")
def image_build(pytestconfig: pytest.Config) -> Iterator[BackgroundBuild]:
    """The build started at collection (or, e.g. for a test picked by hand, one started now)."""
    build = pytestconfig.stash.setdefault(BUILD_KEY, BackgroundBuild())
    try:
        yield build
    finally:
        build.remove()
