"""Driving the real ``helm`` (v3) and ``kubernetes-validate`` against the chart.

Helm runs with HOME and its cache/config/data folders in a temporary directory, so the tests
neither read nor write a developer's Helm setup, and with ``file://`` dependencies only (no
network).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.tools import REPO, require_binary

CHART = REPO / "charts" / "leader-sidecar"

# The oldest minor with native sidecars on by default, and a recent one.
KUBE_VERSIONS = ("1.29.0", "1.35.0")

Manifest = dict[str, Any]


class HelmError(Exception):
    """helm exited non-zero; ``str()`` is its stderr."""


@dataclasses.dataclass
class Helm:
    binary: str
    home: Path

    @classmethod
    def create(cls, home: Path) -> Helm:
        return cls(require_binary("helm"), home)

    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "PATH": "/usr/bin:/bin",
        }

    def run(self, *args: str, cwd: Path | None = None) -> str:
        result = subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=cwd,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            # Helm notes every symlink it follows (files/ links to sidecar/prometheus/).
            errors = [line for line in result.stderr.splitlines() if "symbolic link" not in line]
            raise HelmError("\n".join(errors).strip() or result.stdout.strip())
        return result.stdout

    def template(
        self,
        chart: Path = CHART,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "demo",
        namespace: str = "apps",
        kube_version: str | None = None,
        extra: Sequence[str] = (),
    ) -> list[Manifest]:
        """``helm template`` with `values` passed as a file; the rendered documents, parsed."""
        args = ["template", release, str(chart), "--namespace", namespace, *extra]
        if kube_version:
            args += ["--kube-version", kube_version]
        with tempfile.TemporaryDirectory(dir=self.home) as scratch:
            if values:
                values_file = Path(scratch) / "values.json"  # JSON is YAML
                values_file.write_text(json.dumps(values))
                args += ["--values", str(values_file)]
            return parse_documents(self.run(*args))

    def lint(self, chart: Path = CHART, values: Mapping[str, Any] | None = None) -> str:
        """``helm lint --strict``: warnings fail too. Its output."""
        with tempfile.TemporaryDirectory(dir=self.home) as scratch:
            args = ["lint", "--strict", str(chart)]
            if values:
                values_file = Path(scratch) / "values.json"
                values_file.write_text(json.dumps(values))
                args += ["--values", str(values_file)]
            return self.run(*args)


def parse_documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Manifest) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``containers`` | ``initContainers``, container) for every container of a workload."""
    spec = pod_spec(workload)
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            yield field, container


def sidecar(workload: Manifest, name: str = "leader-sidecar") -> dict[str, Any]:
    found = [c for _, c in containers(workload) if c["name"] == name]
    assert len(found) == 1, f"expected one {name} container, found {len(found)}"
    return found[0]


def validate(manifests: Sequence[Manifest], kube_version: str) -> list[str]:
    """``kubernetes-validate --strict`` on the manifests; the kinds it has no schema for (the
    prometheus-operator CRDs), which the tests check by other means."""
    binary = require_binary("kubernetes-validate")
    result = subprocess.run(
        [binary, "--strict", "--kubernetes-version", kube_version, "-"],
        input=yaml.safe_dump_all(manifests),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "ERROR" not in output, output
    return sorted(
        line.split("for kind ")[1].split(" ")[0]
        for line in output.splitlines()
        if "Couldn't find schema" in line
    )
