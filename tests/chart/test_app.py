"""Leadership follows the app (issue 30) in the chart: the `app.*` values render the sidecar's
--app-health-*, --app-heartbeat and --drain-timeout variables, exactly and only when set; the
example pod's grace period covers the drain; and a real sidecar given the rendered environment,
beside the example app taken from the rendered Deployment, leads only while that app is up and
drains until it stops. The refusals are in test_values.py (SCHEMA_REJECTS, TEMPLATE_REJECTS);
lint and kubernetes-validate run on the `app-*` switches with every other switch."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sidecar import config
from sidecar.app_check import AppCheckSettings
from tests.chart.helm import Helm, containers, find, pod_spec, sidecar
from tests.chart.switches import EXAMPLE, SWITCHES
from tests.chart.test_render import environment, example
from tests.support.sidecars import sidecars

APP_VARIABLES = ("LEADER_SIDECAR_APP_", "LEADER_SIDECAR_DRAIN_")


def app_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(APP_VARIABLES)}


def rendered_env(helm: Helm, values: dict[str, Any]) -> dict[str, str]:
    return environment(sidecar(example(helm.template(values=values))))


def test_every_app_value_renders_its_variable(helm: Helm) -> None:
    assert app_env(rendered_env(helm, SWITCHES["app-health"])) == {
        "LEADER_SIDECAR_APP_HEALTH_URL": "http://127.0.0.1:8080/healthz",
        "LEADER_SIDECAR_APP_HEALTH_PERIOD": "2s",
        "LEADER_SIDECAR_APP_HEALTH_TIMEOUT": "500ms",
        "LEADER_SIDECAR_APP_HEALTH_FAILURES": "5",
        "LEADER_SIDECAR_APP_HEALTH_SUCCESSES": "2",
        "LEADER_SIDECAR_APP_HEARTBEAT": "30s",
        "LEADER_SIDECAR_DRAIN_TIMEOUT": "20s",
    }


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        (
            {"health": {"path": "/ready", "port": 9090}},
            {"LEADER_SIDECAR_APP_HEALTH_URL": "http://127.0.0.1:9090/ready"},
        ),
        (
            {"health": {"path": "/health?full=1", "port": 80}},
            {"LEADER_SIDECAR_APP_HEALTH_URL": "http://127.0.0.1:80/health?full=1"},
        ),
        ({"heartbeat": "10s"}, {"LEADER_SIDECAR_APP_HEARTBEAT": "10s"}),
        ({"heartbeat": 15}, {"LEADER_SIDECAR_APP_HEARTBEAT": "15"}),
        (
            # 0 is a value (no drain), not "unset".
            {"heartbeat": "10s", "drainTimeout": 0},
            {"LEADER_SIDECAR_APP_HEARTBEAT": "10s", "LEADER_SIDECAR_DRAIN_TIMEOUT": "0"},
        ),
        (
            {"health": {"path": "/", "port": 8080}, "drainTimeout": 1.5},
            {
                "LEADER_SIDECAR_APP_HEALTH_URL": "http://127.0.0.1:8080/",
                "LEADER_SIDECAR_DRAIN_TIMEOUT": "1.5",
            },
        ),
    ],
    ids=["path-and-port", "path-with-query", "heartbeat", "heartbeat-seconds", "no-drain", "drain"],
)
def test_only_the_app_values_set_render(
    helm: Helm, app: dict[str, Any], expected: dict[str, str]
) -> None:
    assert app_env(rendered_env(helm, {**EXAMPLE, "app": app})) == expected


@pytest.mark.parametrize("switch", sorted(s for s in SWITCHES if "app" not in SWITCHES[s]))
def test_without_app_values_no_app_variable_renders(helm: Helm, switch: str) -> None:
    for workload in find(helm.template(values=SWITCHES[switch]), "Deployment"):
        assert app_env(environment(sidecar(workload))) == {}


def test_the_default_environment_is_the_one_before_the_app_values(helm: Helm) -> None:
    """Unset app values change nothing; POD_IP (downward API) is the one new variable, for a
    health URL that names the pod's own address."""
    container = sidecar(example(helm.template(values=EXAMPLE)))
    assert [var["name"] for var in container["env"]] == [
        "POD_NAME",
        "POD_NAMESPACE",
        "POD_IP",
        "LEADER_SIDECAR_STORE",
        "LEADER_SIDECAR_LEASE",
        "LEADER_SIDECAR_REVISION",
        "LEADER_SIDECAR_LEASE_DURATION",
        "LEADER_SIDECAR_LISTEN",
        "LEADER_SIDECAR_PUBLIC_LISTEN",
        "LEADER_SIDECAR_LOG_FORMAT",
        "LEADER_SIDECAR_LOG_LEVEL",
        "LEADER_SIDECAR_ROLE_LABEL_KEY",
    ]
    assert container["env"][2] == {
        "name": "POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    empty = {
        "health": {
            "path": "",
            "port": "",
            "period": "",
            "timeout": "",
            "failures": "",
            "successes": "",
        },
        "heartbeat": "",
        "drainTimeout": "",
    }
    assert helm.template(values={**EXAMPLE, "app": empty}) == helm.template(values=EXAMPLE)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            SWITCHES["app-health"],
            AppCheckSettings(
                health_url="http://127.0.0.1:8080/healthz",
                period=2.0,
                timeout=0.5,
                failures=5,
                successes=2,
                heartbeat=30.0,
            ),
        ),
        (SWITCHES["app-heartbeat-native"], AppCheckSettings(heartbeat=10.0)),
        (
            {**EXAMPLE, "app": {"health": {"path": "/ready", "port": 9090}}},
            AppCheckSettings(health_url="http://127.0.0.1:9090/ready"),
        ),
    ],
    ids=["app-health", "app-heartbeat-native", "path-and-port"],
)
def test_the_sidecar_loads_the_app_check_from_the_rendered_environment(
    helm: Helm, values: dict[str, Any], expected: AppCheckSettings
) -> None:
    """``config.load``, as the container runs it: the URL passes the loopback rule, and
    --drain-timeout is the value or, unset, the lease duration."""
    env = rendered_env(helm, values)
    loaded = config.load([], {**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert loaded.app == expected
    drain = values["app"].get("drainTimeout")
    assert loaded.drain_timeout == {"20s": 20.0, 0: 0.0, None: 15.0}[drain]


def grace(helm: Helm, values: dict[str, Any]) -> int:
    seconds: int = pod_spec(example(helm.template(values=values)))["terminationGracePeriodSeconds"]
    return seconds


HEALTH = {"path": "/healthz", "port": 8080}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, 10),
        ({"app": {"heartbeat": "10s", "drainTimeout": 0}}, 10),
        # Sidecar and app get SIGTERM together: the drain (the lease duration unless set)
        # and the sidecar's 2 s hand-over after it.
        ({"app": {"health": HEALTH}}, 17),
        ({"app": {"health": HEALTH}, "lease": {"duration": "1m"}}, 62),
        ({"app": {"health": HEALTH, "drainTimeout": "20s"}}, 22),
        ({"app": {"heartbeat": "10s", "drainTimeout": "2m"}}, 122),
        ({"app": {"heartbeat": "10s", "drainTimeout": "1500ms"}}, 10),
        ({"app": {"health": HEALTH}, "example": {"terminationGracePeriodSeconds": 300}}, 300),
        # nativeSidecar: the example app exits on SIGTERM before the sidecar gets its own, so
        # the drain lasts until the check sees that (failures x period + timeout, or the
        # heartbeat), if shorter than the drain timeout.
        ({"nativeSidecar": True, "app": {"health": HEALTH}}, 10),
        (
            {
                "nativeSidecar": True,
                "app": {"health": {**HEALTH, "period": "10s", "failures": 5}},
            },
            17,
        ),
        ({"nativeSidecar": True, "app": {"heartbeat": "90s", "drainTimeout": "2m"}}, 92),
    ],
    ids=[
        "no-app-check",
        "no-drain",
        "drain-is-the-lease",
        "drain-is-a-longer-lease",
        "drain-timeout",
        "drain-in-minutes",
        "short-drain",
        "longer-grace-kept",
        "native-default-check",
        "native-slow-check",
        "native-heartbeat",
    ],
)
def test_the_examples_grace_period_covers_the_drain(
    helm: Helm, values: dict[str, Any], expected: int
) -> None:
    example_values = {**EXAMPLE["example"], **values.get("example", {})}
    assert grace(helm, {**values, "example": example_values}) == expected


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def status(url: str) -> int:
    """The answer's status; 0 for no answer (nobody listening yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            code: int = response.status
            return code
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def wait_status(url: str, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (last := status(url)) != expected:
        assert time.monotonic() < deadline, f"{url}: {last}, not {expected}, after {timeout} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_sidecar_with_the_rendered_environment_follows_the_example_app(
    helm: Helm, tmp_path: Path
) -> None:
    """The rendered app variables and the example app (its /healthz, its exit on SIGTERM),
    both exactly as the Deployment has them: no app, no campaign; the app up, the sidecar
    leads; SIGTERM to the sidecar while the app is up answers 503 but keeps the process (and
    the lease) until the app gets its SIGTERM, then the drain ends with app_stopped."""
    port = free_port()
    health = {"path": "/healthz", "port": port, "period": "100ms", "timeout": "200ms"}
    values = {**EXAMPLE, "app": {"health": {**health, "failures": 2}, "drainTimeout": "20s"}}
    deployment = example(helm.template(values=values))
    env = app_env(environment(sidecar(deployment)))
    assert env["LEADER_SIDECAR_APP_HEALTH_URL"] == f"http://127.0.0.1:{port}/healthz"
    (app_container,) = [c for _, c in containers(deployment) if c["name"] == "app"]
    assert app_container["command"] == ["python3", "-c"]
    (script,) = app_container["args"]

    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a"], store, lease_duration="2s", env=env) as (proc,):
        time.sleep(1.0)
        assert status(proc.leader_url) == 503, "led without its app"
        app_env_vars = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")},
            "PORT": str(port),
            "POD_NAME": "demo-leader-sidecar-example-7d9c-x2x4q",
            "SIDECAR_URL": proc.leader_url,
        }
        app = subprocess.Popen([sys.executable, "-c", script], env=app_env_vars)
        try:
            wait_status(f"http://127.0.0.1:{port}/healthz", 200, 10)
            wait_status(proc.leader_url, 200, 10)

            proc.terminate()
            proc.wait_log(lambda e: str(e.get("msg", "")).startswith("draining"), 5)
            assert status(proc.leader_url) == 503, "a draining leader still says it leads"
            time.sleep(1.0)
            assert proc.proc.poll() is None, "the sidecar did not wait for its app"

            app.send_signal(signal.SIGTERM)
            assert app.wait(5) == 0, "the example app does not exit on SIGTERM"
            ended = proc.wait_log(lambda e: e.get("msg") == "drain ended", 5)
            assert ended["outcome"] == "app_stopped"
            assert proc.wait_exit(10) == 0
        finally:
            if app.poll() is None:
                app.kill()
                app.wait(5)
