"""Building and running the image without a Docker engine: buildah builds (vfs storage, chroot
isolation), podman runs (with runc: crun fails on this kernel's cgroups).

No base image can be pulled here, so `ensure_base_image` makes one the way Debian's own images
are made: ``debootstrap --variant=minbase`` bookworm with python3, the venv module and CA
certificates, imported ``FROM scratch`` with the PATH an official image sets. Its name is passed
to the Dockerfile's PYTHON_IMAGE build argument; the Dockerfile itself is unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.support.tools import REPO, require_binary

BASE_IMAGE = "localhost/leader-sidecar-test/python3-bookworm:latest"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA_BUNDLE = "/run/leader-sidecar-build-ca.crt"
LOCK = Path(tempfile.gettempdir()) / "leader-sidecar-test-base-image.lock"

STORAGE = ["--storage-driver", "vfs"]
# Debian's podman defaults to crun; runc works here. Limits: the defaults are too high for
# runc in this sandbox.
RUN_FLAGS = ["--runtime", "runc"]
RUN_LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
# A build in the background yields the CPU to the tests running meanwhile.
NICE = ["nice", "-n", "10"]


def run(
    args: Sequence[str], *, timeout: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args[:4])} … exited {result.returncode}\n{result.stdout[-4000:]}\n"
            f"{result.stderr[-4000:]}"
        )
    return result


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([require_binary("podman"), *STORAGE, *args], timeout=timeout, check=check)


def podman_run(
    *args: str, timeout: float = 60, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``podman run`` with the flags this machine needs."""
    return podman(*RUN_FLAGS, "run", *RUN_LIMITS, *args, timeout=timeout, check=check)


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def inspect_image(name: str) -> dict[str, Any]:
    (info,) = json.loads(podman("image", "inspect", name).stdout)
    result: dict[str, Any] = info
    return result


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One base-image build at a time on this machine (parallel test runs share storage)."""
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_base_image(*, nice: bool = False) -> str:
    """The debootstrapped base, built once per machine (about 40 s) and then reused."""
    prefix = NICE if nice else []
    with _locked():
        if image_exists(BASE_IMAGE):
            return BASE_IMAGE
        debootstrap = require_binary("debootstrap")
        with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="leader-sidecar-base-") as work:
            rootfs = Path(work) / "rootfs"
            run(
                [
                    *prefix,
                    debootstrap,
                    "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates",
                    "bookworm",
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                timeout=600,
            )
            # What official slim images drop too: package lists, docs, man pages, locales.
            for trim in (
                "var/lib/apt/lists",
                "var/cache/apt",
                "usr/share/doc",
                "usr/share/man",
                "usr/share/locale",
            ):
                shutil.rmtree(rootfs / trim, ignore_errors=True)
            tarball = Path(work) / "rootfs.tar"
            run([*prefix, "tar", "-C", str(rootfs), "-cf", str(tarball), "."], timeout=300)
            podman(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                'CMD ["python3"]',
                str(tarball),
                BASE_IMAGE,
                timeout=300,
            )
        return BASE_IMAGE


def build_image(tag: str, base: str, *, nice: bool = False) -> subprocess.CompletedProcess[str]:
    """``buildah bud`` of the repository's Dockerfile against `base`. pip inside the build
    reaches PyPI through this machine's TLS proxy, hence its CA bundle mounted read-only and
    named by the PIP_CERT build argument: mounted beside the base's own bundle, not over it,
    so that the image carries the base's CA certificates and not this machine's."""
    revision = run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], timeout=30, check=False
    )
    args = [
        *(NICE if nice else []),
        require_binary("buildah"),
        *STORAGE,
        "bud",
        "--isolation",
        "chroot",
        "--pull=never",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--build-arg",
        f"REVISION={revision.stdout.strip() or 'unknown'}",
        "--tag",
        tag,
        "--file",
        str(REPO / "Dockerfile"),
    ]
    if HOST_CA_BUNDLE.is_file():
        args += [
            "--volume",
            f"{HOST_CA_BUNDLE}:{BUILD_CA_BUNDLE}:ro",
            "--build-arg",
            f"PIP_CERT={BUILD_CA_BUNDLE}",
        ]
    return run([*args, str(REPO)], timeout=900)
