"""Building the image while the rest of the suite runs.

The build (base image, then ``buildah bud``: about 70 s here, over 100 s on a loaded machine)
was the suite's longest single step, and most of it waits on the network and the disk. Started
as soon as pytest knows the image tests will run, it overlaps the other tests; at low CPU
priority (``nice``), so the timing-sensitive tests keep the CPU when they need it. The
``image`` fixture then waits for it; an image test alone waits for the whole build, as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

import pytest

from tests.image.containers import build_image, ensure_base_image, podman
from tests.support.tools import find_binary

TOOLS = ("buildah", "podman", "runc", "debootstrap")
TAG_PREFIX = "localhost/leader-sidecar-test/image"


def wanted(config: pytest.Config) -> bool:
    """Image tests run in CI and when asked for; elsewhere they are opt-in (~1-2 min)."""
    if os.environ.get("CI") or os.environ.get("LEADER_SIDECAR_IMAGE_TESTS") == "1":
        return True
    markexpr = config.getoption("markexpr") or ""
    return "image" in markexpr and "not image" not in markexpr


class BackgroundBuild:
    """One image build in a thread; `tag()` waits for it and re-raises its failure."""

    def __init__(self) -> None:
        self._tag = f"{TAG_PREFIX}:{uuid.uuid4().hex[:12]}"
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, name="image-build", daemon=True)
            self._thread.start()

    def _build(self) -> None:
        try:
            build_image(self._tag, ensure_base_image(nice=True), nice=True)
        except BaseException as error:  # handed to the test that waits for the image
            self._error = error

    def tag(self) -> str:
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._tag

    def remove(self) -> None:
        """Wait for a build still running (an interrupted session), then delete the image."""
        if self._thread is not None:
            self._thread.join(timeout=900)
            with contextlib.suppress(Exception):
                podman("rmi", "--force", self._tag, check=False)


def tools_present() -> bool:
    return all(find_binary(tool) for tool in TOOLS)
