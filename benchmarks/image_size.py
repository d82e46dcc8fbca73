"""What the container image is made of: every file of its root filesystem counted once under
the first part it belongs to (the virtualenv by package, the interpreter, the standard library
by directory, shared libraries, the OS tools a running sidecar never uses), in MB.

    python -m benchmarks.image_size [IMAGE ...]

With no IMAGE it builds this tree's Dockerfile the way tests/image does (buildah on the
debootstrapped bookworm base) and measures that; give tags to compare builds side by side,
e.g. one built from an older commit. Mounting an image needs root (``podman image mount``).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.image.containers import build_image, ensure_base_image, podman

VENV = "opt/leader-sidecar"
SITE = f"{VENV}/lib/python3.*/site-packages"
STDLIB = "usr/*lib/python3.*"
# (part, glob patterns relative to the root); the first match wins.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    *(
        (f"venv: {package}", (f"{SITE}/{package}/*", f"{SITE}/{package}-*.dist-info/*"))
        for package in ("asyncpg", "aiohttp", "redis", "yaml", "sidecar", "multidict")
    ),
    ("venv: sidecar", (f"{SITE}/leader_sidecar-*",)),
    ("venv: yaml", (f"{SITE}/_yaml/*", f"{SITE}/pyyaml-*")),
    ("venv: 10 other packages", (f"{VENV}/*",)),
    ("interpreter (python3.11 binary, libpython)", ("usr/*bin/python3*", "usr/*lib/libpython3*")),
    *(
        (f"stdlib: {name}", (f"{STDLIB}/{pattern}",))
        for name, pattern in (
            ("base image's pip, setuptools, wheel", "site-packages/*"),
            ("test/ and other tests", "test/*"),
            ("tests inside packages", "*/test/*"),
            ("tests inside packages", "*/tests/*"),
            ("tests inside packages", "*/idle_test/*"),
            ("config-3.11-*", "config-3.11*"),
            ("idlelib, tkinter, turtledemo", "idlelib/*"),
            ("idlelib, tkinter, turtledemo", "tkinter/*"),
            ("idlelib, tkinter, turtledemo", "turtledemo/*"),
            ("lib2to3", "lib2to3/*"),
            ("pydoc_data", "pydoc_data/*"),
            ("distutils", "distutils/*"),
            ("ensurepip, venv", "ensurepip/*"),
            ("ensurepip, venv", "venv/*"),
            ("unittest", "unittest/*"),
            ("lib-dynload (C modules)", "lib-dynload/*"),
            ("the rest", "*"),
        )
    ),
    ("venv wheels Debian keeps for `python3 -m venv`", ("usr/share/python-wheels/*",)),
    ("perl", ("usr/bin/perl*", "usr/lib/*/perl*", "usr/share/perl*")),
    (
        "apt, dpkg and their state",
        ("usr/bin/apt*", "usr/bin/dpkg*", "usr/lib/apt/*", "usr/lib/*/libapt*", "var/*"),
    ),
    ("gconv (iconv modules)", ("usr/lib/*/gconv/*",)),
    ("shared libraries", ("usr/lib/*/*.so*", "usr/lib/*.so*", "usr/lib64/*")),
    ("other libraries (security, systemd…)", ("usr/lib/*",)),
    ("timezone data", ("usr/share/zoneinfo/*",)),
    ("CA certificates", ("usr/share/ca-certificates/*", "etc/ssl/*")),
    ("other programs (shell, coreutils, …)", ("usr/bin/*", "usr/sbin/*")),
    ("/usr/share, /etc, other", ("*",)),
]


def measure(root: Path) -> Counter[str]:
    """Bytes per part; hard links counted once."""
    sizes: Counter[str] = Counter()
    seen: set[int] = set()
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            info = path.lstat()
            if not path.is_file() or path.is_symlink() or info.st_ino in seen:
                continue
            seen.add(info.st_ino)
            relative = str(path.relative_to(root))
            part = next(
                name
                for name, patterns in PARTS
                if any(fnmatch.fnmatch(relative, pattern) for pattern in patterns)
            )
            sizes[part] += info.st_size
    return sizes


@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    path = podman("image", "mount", image).stdout.strip()
    try:
        yield Path(path)
    finally:
        podman("image", "unmount", image, check=False)


def table(images: list[str], sizes: list[Counter[str]], reported: list[str]) -> str:
    lines = [
        "| part | " + " | ".join(images) + " |",
        "|---|" + "---:|" * len(images),
        "| **image, as `podman images` reports it** | "
        + " | ".join(f"**{size}**" for size in reported)
        + " |",
    ]
    order = list(dict.fromkeys(name for name, _ in PARTS))
    for part in order:
        values = [counts.get(part, 0) for counts in sizes]
        if any(values):
            lines.append(f"| {part} | " + " | ".join(f"{v / 1e6:.1f}" for v in values) + " |")
    totals = " | ".join(f"{sum(counts.values()) / 1e6:.1f}" for counts in sizes)
    lines.append(f"| files, total | {totals} |")
    return "\n".join(lines)


def reported_size(image: str) -> str:
    return podman("images", "--format", "{{.Size}}", image).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="*", metavar="IMAGE")
    args = parser.parse_args()
    images: list[str] = args.images
    built = None
    if not images:
        built = f"localhost/leader-sidecar-test/size:{uuid.uuid4().hex[:12]}"
        build_image(built, ensure_base_image(nice=True), nice=True)
        images = [built]
    try:
        sizes = []
        for image in images:
            with mounted(image) as root:
                sizes.append(measure(root))
        print(table(images, sizes, [reported_size(image) for image in images]))
    finally:
        if built:
            podman("rmi", "--force", built, check=False)


if __name__ == "__main__":
    main()
