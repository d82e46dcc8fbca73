"""scripts/image_rootfs.py without a build: reading ``ldd`` and copying paths with the symlinks
on the way to them (the image build itself is tests/image/test_image.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.tools import REPO


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_rootfs", REPO / "scripts/image_rootfs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rootfs = load_script()

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd6b1f2000)
\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f0e5c0a1000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e5bec0000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e5c1e4000)
"""


def test_ldd_names_each_library_and_the_loader_but_not_the_vdso() -> None:
    assert rootfs.ldd_paths(LDD) == [
        Path("/lib/x86_64-linux-gnu/libssl.so.3"),
        Path("/lib/x86_64-linux-gnu/libc.so.6"),
        Path("/lib64/ld-linux-x86-64.so.2"),
    ]


def test_a_library_ldd_cannot_find_fails_the_build() -> None:
    with pytest.raises(SystemExit, match=r"libmissing\.so\.1"):
        rootfs.ldd_paths(LDD + "\tlibmissing.so.1 => not found\n")


def test_a_path_comes_with_every_symlink_on_the_way_to_it(tmp_path: Path) -> None:
    """Debian's merged /usr (a symlinked directory) and the venv's interpreter link chain."""
    system = tmp_path / "system"
    (system / "usr/lib").mkdir(parents=True)
    (system / "usr/lib/libz.so.1.3").write_bytes(b"ELF")
    (system / "usr/lib/libz.so.1").symlink_to("libz.so.1.3")
    (system / "lib").symlink_to("usr/lib")
    root = tmp_path / "root"

    rootfs.Stager(root).copy(system / "lib/libz.so.1")

    staged = root / system.relative_to("/")
    assert os.readlink(staged / "lib") == "usr/lib"
    assert os.readlink(staged / "usr/lib/libz.so.1") == "libz.so.1.3"
    assert (staged / "lib/libz.so.1").read_bytes() == b"ELF"


def test_a_tree_brings_the_targets_of_links_leading_out_of_it(tmp_path: Path) -> None:
    system = tmp_path / "system"
    (system / "venv/bin").mkdir(parents=True)
    (system / "usr/bin").mkdir(parents=True)
    (system / "usr/bin/python3.11").write_bytes(b"ELF")
    (system / "venv/bin/python3").symlink_to(system / "usr/bin/python3.11")
    root = tmp_path / "root"

    rootfs.Stager(root).copy_tree(system / "venv")

    staged = root / system.relative_to("/")
    assert os.readlink(staged / "venv/bin/python3") == str(system / "usr/bin/python3.11")
    assert (staged / "usr/bin/python3.11").read_bytes() == b"ELF"
