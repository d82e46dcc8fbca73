"""A store or subcommand whose driver is an optional extra (pyproject.toml's
``[project.optional-dependencies]``) says, in one line and exit 2, which extra to install —
never a ``ModuleNotFoundError`` traceback (issue 32: ``postgresql-schema --help`` and
``--store postgresql://…`` on a plain ``pip install .``). What needs no driver works without
it. Real processes, with the driver made unimportable as if not installed."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.tools import REPO
from tests.unit.test_config import run_cli

POSTGRESQL = "postgresql://u@127.0.0.1:1/db"
INSTALL_POSTGRESQL = "pip install 'leader-sidecar[postgresql]'"
INSTALL_EXEC = "pip install 'leader-sidecar[kubeconfig-exec]'"


def without(module: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as on an install without ``module`` (``None`` in sys.modules: every import of
    it raises ImportError, as a missing package does)."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from sidecar.cli import main; raise SystemExit(main())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=30,
        check=False,
    )


def test_the_extras_this_file_covers_are_every_runtime_extra_pyproject_declares() -> None:
    """A new extra needs its line here (and in --help): "test" is the only other one."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras) == {"postgresql", "kubeconfig-exec", "test"}
    assert extras["postgresql"] == ["asyncpg>=0.29"]
    assert extras["kubeconfig-exec"] == ["kubernetes>=37"]


@pytest.mark.parametrize(
    "args",
    [
        ["--store", POSTGRESQL, "--listen", "127.0.0.1:0", "--public-listen", "127.0.0.1:0"],
        ["status", "--store", POSTGRESQL],
        ["postgresql-schema", "--store", POSTGRESQL, "--grant", "sidecar"],
    ],
    ids=["sidecar", "status", "postgresql-schema"],
)
def test_the_postgresql_store_without_asyncpg_names_the_extra_in_one_line(
    args: list[str],
) -> None:
    result = without("asyncpg", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "--store" in lines[0]
    assert lines[0].endswith(
        "the PostgreSQL store needs its driver, asyncpg, which is not installed: "
        + INSTALL_POSTGRESQL
    )
    assert "Traceback" not in result.stderr


def test_a_postgresql_driver_installed_but_broken_stops_the_sidecar_in_the_same_line(
    tmp_path: Path,
) -> None:
    """Whether the driver is installed is read with the configuration; it is imported once the
    listeners answer, and one that fails then stops the sidecar as a missing one does."""
    (tmp_path / "asyncpg").mkdir()
    (tmp_path / "asyncpg" / "__init__.py").write_text("raise ImportError('half installed')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "--store", POSTGRESQL,
         "--listen", "127.0.0.1:0", "--public-listen", "127.0.0.1:0"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"leader-sidecar: --store={POSTGRESQL}: the PostgreSQL store needs its driver, "
        f"asyncpg, which is not installed: {INSTALL_POSTGRESQL}"
    ]


def test_postgresql_schema_help_and_print_need_no_driver() -> None:
    help_ = without("asyncpg", "postgresql-schema", "--help")
    assert help_.returncode == 0, help_.stderr
    assert INSTALL_POSTGRESQL in " ".join(help_.stdout.split())
    printed = without("asyncpg", "postgresql-schema", "--print", "--grant", "sidecar")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("BEGIN;\nCREATE SCHEMA IF NOT EXISTS leader_sidecar;")
    assert printed.stdout.endswith("COMMIT;\n")
    assert 'GRANT USAGE ON SCHEMA leader_sidecar TO "sidecar";' in printed.stdout
    assert printed.stderr == ""


def test_an_exec_plugin_kubeconfig_without_the_official_client_stops_at_start(
    tmp_path: Path,
) -> None:
    """It used to start, bind, and retry "cannot load the Kubernetes client configuration"
    for ever."""
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
        "command: /bin/true, interactiveMode: Never}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    # With a namespace given the kubeconfig is read once the listeners answer: the same line.
    for command, namespace in itertools.product(([], ["status"]), ([], ["--namespace", "n"])):
        result = without(
            "kubernetes",
            *command,
            "--store", "kubernetes", "--lease", "x", "--kubeconfig", str(config),
            "--request-timeout", "1s", *namespace,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            ("leader-sidecar: --kubeconfig=", "leader-sidecar status: --kubeconfig=")
        )
        wanted = f"an exec plugin; install the official client for it ({INSTALL_EXEC})"
        assert wanted in lines[0]


def test_the_help_says_which_extra_each_store_needs() -> None:
    text = " ".join(run_cli("--help").stdout.split())
    assert f"postgresql:// needs the [postgresql] extra: {INSTALL_POSTGRESQL}" in text
    assert f"--store postgresql://... {INSTALL_POSTGRESQL}" in text
    assert f"a --kubeconfig with an exec plugin {INSTALL_EXEC}" in text
