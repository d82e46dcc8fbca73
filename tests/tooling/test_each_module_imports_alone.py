"""Every module of the sidecar imports on its own, in a fresh interpreter: an import circle
shows only when a module is imported first (``import sidecar.binding`` alone once failed:
options → timing → backends → every store's description → options), and a test file or a
tool that starts there would break."""

from __future__ import annotations

import subprocess
import sys

from tests.support.tools import REPO

# Forks from a parent holding only the third-party libraries, so each child pays for our
# modules alone; one child per module.
CHILDREN = """
import importlib, os, pkgutil, sys
import aiohttp, prometheus_client, yaml  # noqa: F401  (the parent's, shared by every child)
import sidecar
names = sorted(
    m.name for m in pkgutil.walk_packages(sidecar.__path__, "sidecar.") if ".__main__" not in m.name
)
failed = []
for name in names:
    for loaded in [k for k in sys.modules if k.startswith("sidecar.")]:
        del sys.modules[loaded]
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if "partially initialized" in str(exc) or "circular import" in str(exc):
                print(f"{name}: {exc}", flush=True)
                os._exit(1)
        except BaseException:
            pass  # an optional driver missing is not a circle
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name)
print(f"{len(names)} modules, {len(failed)} failed: {failed}")
sys.exit(1 if failed or len(names) < 50 else 0)
"""


def test_each_module_imports_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILDREN],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
