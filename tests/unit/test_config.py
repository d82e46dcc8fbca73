"""Configuration: flags, environment variables, defaults, and refusing bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import load, parse_duration, parse_host_port
from sidecar.config_error import ConfigError
from sidecar.timing import Timing


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15", 15.0),
        ("1.5", 1.5),
        ("1500ms", 1.5),
        ("2s", 2.0),
        ("1m", 60.0),
        (" 0.25s ", 0.25),
        (".5", 0.5),
        ("1h", 3600.0),
    ],
)
def test_durations_accept_plain_seconds_and_suffixes(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["-1", "0", "0ms", "abc", "1.5.2", "5 seconds", "", "1d", "-2s"])
def test_durations_refuse_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="positive duration"):
        parse_duration(text)


def test_host_port_forms() -> None:
    assert str(parse_host_port("127.0.0.1:4040")) == "127.0.0.1:4040"
    assert str(parse_host_port("[::1]:4040")) == "[::1]:4040"
    assert parse_host_port("0.0.0.0:0").port == 0
    for bad in ("4040", "localhost", "1.2.3.4:65536", ":80", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_host_port(bad)


def test_defaults_outside_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load([], environ={})
    assert config.store == "sqlite:///./leader-sidecar.db"
    assert config.lease == "default"
    assert config.namespace == "default"
    assert config.timing == Timing(15.0, 5.0, 2.0, 2.5)
    assert str(config.listen) == "127.0.0.1:4040"
    assert str(config.public_listen) == "0.0.0.0:4041"
    assert (config.log_format, config.log_level) == ("json", "info")


def test_in_a_cluster_the_store_is_kubernetes_and_the_lease_is_required() -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "app-0", "POD_NAMESPACE": "prod"}
    with pytest.raises(ConfigError, match="--lease: is required with the kubernetes store"):
        load([], environ=environ)
    config = load(["--lease", "my-app"], environ=environ)
    assert config.store == "kubernetes"
    assert config.lease_ref == "prod/my-app"
    assert config.identity.startswith("app-0_")
    assert config.pod_name == "app-0"


def test_flags_win_over_environment_variables(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/x.db"
    environ = {"LEADER_SIDECAR_LEASE_DURATION": "30s", "LEADER_SIDECAR_STORE": store}
    assert load([], environ=environ).timing.lease_duration == 30
    assert load(["--lease-duration", "9"], environ=environ).timing.lease_duration == 9
    assert load([], environ=environ).store == store


def test_the_renew_interval_defaults_to_a_third_of_the_lease(tmp_path: Path) -> None:
    config = load(["--store", f"sqlite:///{tmp_path}/x.db", "--lease-duration", "1s"], environ={})
    assert config.timing.renew_interval == pytest.approx(1 / 3)
    assert config.timing.retry_period == pytest.approx(1 / 3)
    assert config.timing.request_timeout == pytest.approx(1 / 6)


def test_a_renew_interval_without_one_interval_of_margin_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        Timing.build(lease_duration=15, renew_interval=7)
    message = str(refused.value)
    assert message.startswith("--renew-interval=7s:")
    assert "use at most" in message
    Timing.build(lease_duration=15, renew_interval=5)


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    environment.pop("KUBERNETES_SERVICE_HOST", None)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--lease-duration", "-1"], {}, ["--lease-duration", "-1", "positive duration"]),
        (["--lease-duration", "soon"], {}, ["--lease-duration", "soon", "positive duration"]),
        (["--renew-interval", "10s"], {}, ["--renew-interval", "10s", "use at most"]),
        (["--listen", "127.0.0.1:70000"], {}, ["--listen", "70000", "0 to 65535"]),
        (["--store", "ftp://example"], {}, ["--store", "ftp://example", "sqlite:///"]),
        (
            ["--store", "sqlite:////no/such/dir/x.db"],
            {},
            ["--store", "/no/such/dir", "does not exist"],
        ),
        (["--lease", "Not_A_Name"], {}, ["--lease", "Not_A_Name", "lowercase DNS name"]),
        (["--log-level", "loud"], {}, ["--log-level", "loud", "one of"]),
        (
            [],
            {"LEADER_SIDECAR_METRICS_PER_LEASE": "yes"},
            ["LEADER_SIDECAR_METRICS_PER_LEASE", "yes", "true or false"],
        ),
        ([], {"LEADER_SIDECAR_LEASE_DURATION": "0"}, ["LEADER_SIDECAR_LEASE_DURATION", "0"]),
        (
            [],
            {"LEADER_SIDECAR_LEASE_DURATON": "3"},
            ["LEADER_SIDECAR_LEASE_DURATON", "did you mean LEADER_SIDECAR_LEASE_DURATION"],
        ),
        (["--request-timeout", "5s"], {}, ["--request-timeout", "shorter than the renew interval"]),
        (["--no-such-flag"], {}, ["--no-such-flag"]),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_setting(
    tmp_path: Path, args: list[str], env: dict[str, str], names: list[str]
) -> None:
    result = run_cli(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0]
    assert lines[0].startswith("leader-sidecar: ")


def test_help_lists_every_flag_with_its_environment_variable() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag, env in (
        ("--lease-duration", "LEADER_SIDECAR_LEASE_DURATION"),
        ("--public-listen", "LEADER_SIDECAR_PUBLIC_LISTEN"),
        ("--store", "LEADER_SIDECAR_STORE"),
    ):
        assert flag in result.stdout
        assert env in result.stdout.replace("\n", "").replace(" ", "")


def test_the_embedded_store_imports_no_redis_or_kubernetes_client() -> None:
    """A store's client library is imported only when that store is chosen."""
    code = (
        "import sys\n"
        "from sidecar.config import load\n"
        "from sidecar.app import Sidecar\n"
        "Sidecar(load(['--store', 'sqlite:////tmp/imports.db'], environ={})).open()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'kubernetes')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"


KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: dev
  context: {cluster: c, user: u, namespace: team-a}
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: abc}
"""


def test_the_kubeconfig_context_namespace_is_the_default_as_for_kubectl(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(KUBECONFIG)
    base = ["--store", "kubernetes", "--lease", "jobs"]
    assert load(base, environ={"KUBECONFIG": str(path)}).namespace == "team-a"
    assert load([*base, "--kubeconfig", str(path)], environ={}).namespace == "team-a"
    flagged = load([*base, "--namespace", "ops"], environ={"KUBECONFIG": str(path)})
    assert flagged.namespace == "ops"
    pod = load(base, environ={"KUBECONFIG": str(path), "POD_NAMESPACE": "prod"})
    assert pod.namespace == "prod"


def test_a_kubeconfig_that_cannot_work_stops_the_start_naming_it_and_why(tmp_path: Path) -> None:
    """Not later, as a store that never answers."""
    garbled = tmp_path / "garbled"
    garbled.write_text("clusters: [\n")
    base = ["--store", "kubernetes", "--lease", "jobs"]
    with pytest.raises(ConfigError, match=r"^--kubeconfig=.*garbled: kubeconfig .*cannot read it"):
        load([*base, "--kubeconfig", str(garbled)], environ={})
    broken = tmp_path / "broken"
    broken.write_text("clusters: []\n")
    with pytest.raises(ConfigError, match=r"^KUBECONFIG=.*no current-context"):
        load(base, environ={"KUBECONFIG": str(broken)})
    # Another store never reads it: a stray KUBECONFIG in a shell is no reason to fail.
    assert load(["--store", "redis://127.0.0.1:6379"], environ={"KUBECONFIG": str(garbled)})


def test_the_version_constant_is_the_releases_version() -> None:
    """The User-Agent sends ``sidecar.__version__``; it must be what pyproject.toml releases."""
    import tomllib

    import sidecar
    from tests.support.tools import REPO

    with (REPO / "pyproject.toml").open("rb") as file:
        assert sidecar.__version__ == tomllib.load(file)["project"]["version"]
