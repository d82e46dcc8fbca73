"""The Dockerfile passes hadolint and keeps the promises the chart relies on (numeric non-root
user, the CLI as entrypoint, a writable state directory), without building it; the build
itself is tests/image/test_image.py."""

from __future__ import annotations

import re
import subprocess

from tests.support.tools import REPO, require_binary

DOCKERFILE = REPO / "Dockerfile"


def final_stage() -> list[str]:
    """Instructions of the last stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return lines[last_from:]


def test_hadolint_finds_nothing() -> None:
    """hadolint at its strictest threshold (style): not one finding."""
    result = subprocess.run(
        [require_binary("hadolint"), "--failure-threshold", "style", "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_the_image_runs_the_cli_as_a_numeric_non_root_user() -> None:
    """Kubernetes' runAsNonRoot can only verify a numeric USER; the chart's runAsUser matches."""
    stage = final_stage()
    users = [line.split()[1] for line in stage if line.upper().startswith("USER ")]
    assert users == ["65532:65532"]
    assert 'ENTRYPOINT ["leader-sidecar"]' in stage
    # The final stage is the root filesystem staged in the build stage and nothing else: the
    # interpreter comes along at the path the venv's links name.
    froms = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")]
    assert froms == ["FROM ${PYTHON_IMAGE} AS build", "FROM scratch"]
    copies = [line for line in stage if line.upper().startswith(("COPY ", "ADD ", "RUN "))]
    assert all(line.startswith("COPY --from=build") for line in copies), copies


def test_the_build_context_is_only_the_package() -> None:
    """.dockerignore lets in the package, its metadata and the staging script, not tests,
    charts, .git or databases."""
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*"
    assert {line for line in rules if line.startswith("!")} == {
        "!pyproject.toml",
        "!README.md",
        "!sidecar/",
        "!scripts/image_rootfs.py",  # stages the final image's root filesystem
    }
