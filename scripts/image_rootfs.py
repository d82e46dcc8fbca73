#!/usr/bin/env python3
"""Stages the image's whole root filesystem: what a running sidecar needs, nothing else.

Run by the Dockerfile's build stage with the virtualenv's own interpreter:

    /opt/leader-sidecar/bin/python image_rootfs.py /opt/leader-sidecar /rootfs

The final stage is ``FROM scratch`` plus this directory. It holds the virtualenv, the
interpreter it links to, the standard library without what only development uses (tests,
IDLE, tkinter, lib2to3, ensurepip, distutils, the base image's own pip and setuptools, the
static library), the shared libraries that the interpreter and every extension module load
(found with ``ldd``, so no list of libraries is kept here), the CA bundle OpenSSL reads, and
/etc entries for the numeric user. No shell, no package manager, no perl, no coreutils.

Paths stay where the base image has them, symlinks included (Debian's merged /usr, the
virtualenv's ``bin/python3 -> /usr/bin/python3``), so the same script serves
``python:3.11-slim-bookworm`` (interpreter under /usr/local) and Debian's own ``python3``.
"""

from __future__ import annotations

import compileall
import os
import py_compile
import re
import shutil
import ssl
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

UID = GID = 65532
USER = "leader-sidecar"
STATE_DIR = Path("/var/lib/leader-sidecar")

# Standard-library packages a running sidecar never imports (the image test imports every
# module of the sidecar and its drivers inside the image, so a needed one cannot go missing
# unnoticed). Test directories go wherever they sit.
UNUSED_STDLIB = {
    "site-packages",  # the base image's pip and setuptools; the venv has its own packages
    "dist-packages",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "lib2to3",
    "pydoc_data",
    "ensurepip",
    "distutils",
    "venv",
    "unittest",
    "curses",
    "dbm",
    "__phello__",
}
TEST_DIRS = {"test", "tests", "idle_test"}
# Extension modules for terminals, old databases, audio and CPython's own tests; dropping
# them also drops the libraries they link (ncurses, readline, Berkeley DB, libcrypt).
UNUSED_EXTENSIONS = re.compile(
    r"^(_test|_ctypes_test|xxlimited|_xxtestfuzz|_curses|readline|_dbm|_gdbm|_tkinter|nis"
    r"|ossaudiodev|audioop|spwd|_crypt)"
)

# `ldd` lines: "libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)" and the loader itself,
# "/lib64/ld-linux-x86-64.so.2 (0x…)".
LDD_RESOLVED = re.compile(r"=>\s*(/\S+)")
LDD_LOADER = re.compile(r"^\s*(/\S+)\s+\(0x")

NSSWITCH = """\
passwd: files
group:  files
hosts:  files dns
"""


def ldd_paths(output: str) -> list[Path]:
    """The libraries one `ldd` run names, loader included; a library not found fails."""
    paths: list[Path] = []
    for line in output.splitlines():
        if "not found" in line:
            raise SystemExit(f"ldd: a library is missing: {line.strip()}")
        match = LDD_RESOLVED.search(line) or LDD_LOADER.match(line)
        if match:
            paths.append(Path(match.group(1)))
    return paths


class Stager:
    """Copies absolute paths of this machine into `root`, symlinks kept as symlinks."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def inside(self, path: Path) -> Path:
        return self.root / path.relative_to("/")

    def copy(self, path: Path) -> None:
        """`path` and every symlink on the way to it, in files or in parent directories."""
        current = Path("/")
        for index, part in enumerate(path.parts[1:]):
            current = current / part
            if current.is_symlink():
                self._link(current)
                target = current.parent / os.readlink(current)
                rest = path.parts[index + 2 :]
                self.copy(Path(os.path.normpath(target.joinpath(*rest))))
                return
        destination = self.inside(path)
        if destination.exists():
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, destination, symlinks=True)
        else:
            shutil.copy2(path, destination)

    def copy_tree(self, source: Path, skip: Iterable[str] = ()) -> None:
        """A directory tree; symlinks leading out of it bring their targets along."""
        skipped = set(skip)
        shutil.copytree(
            source,
            self.inside(source),
            symlinks=True,
            dirs_exist_ok=True,
            ignore=lambda _dir, names: [name for name in names if name in skipped],
        )
        for link in walk_links(self.inside(source)):
            target = Path(os.path.normpath(link.parent / os.readlink(link)))
            if not target.is_relative_to(self.root):
                self.copy(target)

    def _link(self, link: Path) -> None:
        destination = self.inside(link)
        if not destination.is_symlink():
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.symlink_to(os.readlink(link))


def walk_links(top: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(directory, name)
            if path.is_symlink():
                yield path


def stage_stdlib(stager: Stager) -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = f"config-{sys.version_info.major}.{sys.version_info.minor}"
    unused = UNUSED_STDLIB | {name for name in os.listdir(stdlib) if name.startswith(version)}
    stager.copy_tree(stdlib, skip=unused)
    staged = stager.inside(stdlib)
    for directory, dirs, _files in os.walk(staged):
        for name in [name for name in dirs if name in TEST_DIRS]:
            shutil.rmtree(Path(directory, name))
            dirs.remove(name)
    dynload = staged / "lib-dynload"
    for module in list(dynload.iterdir()) if dynload.is_dir() else []:
        if UNUSED_EXTENSIONS.match(module.name):
            module.unlink()
    compile_bytecode(staged, stdlib)
    return staged


def compile_bytecode(staged: Path, runs_from: Path) -> None:
    """Bytecode that a read-only root never has to redo. Unchecked hashes, because copying
    into an image may round the sources' timestamps (buildah moves them by up to a second)
    and a timestamp-checked .pyc would then be recompiled, in memory, at every start; the
    image's sources never change. python:*-slim ships its standard library without bytecode."""
    ok = compileall.compile_dir(
        staged,
        ddir=str(runs_from),  # the path tracebacks name
        force=True,
        quiet=1,
        workers=0,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:
        raise SystemExit(f"compileall failed in {runs_from}")


def stage_libraries(stager: Stager, elf_files: Iterable[Path]) -> None:
    """Every shared library these files load, plus the dynamic loader and libgcc_s."""
    libraries: set[Path] = set()
    for elf in elf_files:
        result = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False)
        if result.returncode == 0:  # not 0: statically linked, nothing to add
            libraries.update(ldd_paths(result.stdout))
    # glibc loads libgcc_s at run time (dlopen, so ldd cannot see it) to unwind a thread that
    # calls pthread_exit, as CPython's threads may at interpreter shutdown.
    libc = next((path for path in libraries if path.name.startswith("libc.so")), None)
    if libc is not None and (libc.parent / "libgcc_s.so.1").exists():
        libraries.add(libc.parent / "libgcc_s.so.1")
    for library in sorted(libraries):
        stager.copy(library)


def elf_files(*directories: Path) -> Iterator[Path]:
    for directory in directories:
        for path in directory.rglob("*.so*"):
            if path.is_file() and not path.is_symlink():
                yield path


def stage_tls(stager: Stager) -> None:
    """The CA bundle at the path OpenSSL reads by default, and OpenSSL's configuration."""
    paths = ssl.get_default_verify_paths()
    bundle = Path(paths.openssl_cafile)
    if not bundle.exists():
        raise SystemExit(f"no CA bundle at {bundle}: install ca-certificates in the base image")
    stager.copy(bundle)
    config = Path(paths.openssl_cafile).parent / "openssl.cnf"
    if config.exists():
        stager.copy(config)


def stage_etc(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"{USER}:x:{UID}:{GID}:{USER}:{STATE_DIR}:/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\n{USER}:x:{GID}:\n")
    (etc / "nsswitch.conf").write_text(NSSWITCH)
    # The loader's cache, rebuilt for the staged libraries (python:*-slim keeps libpython in
    # /usr/local/lib, which only the cache names).
    conf = Path("/etc/ld.so.conf")
    if conf.exists() and shutil.which("ldconfig"):
        shutil.copy2(conf, etc / "ld.so.conf")
        if Path("/etc/ld.so.conf.d").is_dir():
            shutil.copytree("/etc/ld.so.conf.d", etc / "ld.so.conf.d", dirs_exist_ok=True)
        subprocess.run(["ldconfig", "-r", str(root)], check=True)


def stage_directories(root: Path) -> None:
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    state = root / STATE_DIR.relative_to("/")
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o750)
    os.chown(state, UID, GID)


def main(venv: Path, root: Path) -> None:
    stager = Stager(root)
    stager.copy_tree(venv)
    compile_bytecode(stager.inside(venv), venv)
    stager.copy(Path(sys.executable))  # the venv's python3 and each link to the interpreter
    stdlib = stage_stdlib(stager)
    interpreter = Path(os.path.realpath(sys.executable))
    stage_libraries(stager, [interpreter, *elf_files(stdlib / "lib-dynload", venv)])
    stage_tls(stager)
    stage_etc(root)
    stage_directories(root)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} VENV ROOT")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
