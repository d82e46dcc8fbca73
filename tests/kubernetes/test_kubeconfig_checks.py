"""What kubectl refuses in a kubeconfig, refused at start with one line; credentials that never
print; token files as client-go reads them; kubeconfig lists with missing files."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sidecar.backends.kubernetes.client import CallError
from sidecar.backends.kubernetes.kubeconfig import (
    Kubeconfig,
    KubeconfigError,
    StaticHeader,
    TokenFile,
    header_key_escape,
)
from sidecar.config import load
from sidecar.config_error import ConfigError
from tests.redis.servers import TlsFiles
from tests.support.tools import REPO

SECRET = "s3cr3t-t0ken-value"


def kubeconfig(path: Path, cluster: str, user: str = f"token: {SECRET}") -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n"
        "clusters:\n- name: prod\n  cluster:\n" + textwrap.indent(cluster, "    ") + "\n"
        "contexts:\n- name: ctx\n  context: {cluster: prod, user: me, namespace: team-a}\n"
        "users:\n- name: me\n  user:\n" + textwrap.indent(user, "    ") + "\n"
    )
    return path


@pytest.mark.parametrize("value", ['"false"', '"true"', "0", "no-thanks"])
def test_a_boolean_that_is_not_a_yaml_boolean_is_refused_naming_the_field(
    tmp_path: Path, value: str
) -> None:
    """``bool("false")`` is true: a quoted "false" used to turn certificate checks off."""
    config = kubeconfig(
        tmp_path / "kc", f"server: https://kube.example\ninsecure-skip-tls-verify: {value}"
    )
    with pytest.raises(KubeconfigError) as refused:
        Kubeconfig.read(str(config))
    assert "cluster 'prod': insecure-skip-tls-verify must be true or false (unquoted)" in str(
        refused.value
    )


def test_yaml_booleans_are_taken_as_they_are(tmp_path: Path) -> None:
    config = kubeconfig(
        tmp_path / "kc", "server: https://kube.example\ninsecure-skip-tls-verify: false"
    )
    connection = Kubeconfig.read(str(config)).connection({})
    assert connection.ssl is not True
    assert connection.ssl.verify_mode.name == "CERT_REQUIRED"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "ca", ["certificate-authority: ca.crt", "certificate-authority-data: Zm9v"]
)
def test_a_ca_together_with_skipping_verification_is_refused_as_kubectl_refuses_it(
    tmp_path: Path, ca: str
) -> None:
    config = kubeconfig(
        tmp_path / "kc", f"server: https://kube.example\n{ca}\ninsecure-skip-tls-verify: true"
    )
    with pytest.raises(KubeconfigError, match="root certificates file with the insecure flag"):
        Kubeconfig.read(str(config))


def test_a_refused_kubeconfig_stops_the_sidecar_with_exit_2_and_one_line(tmp_path: Path) -> None:
    config = kubeconfig(
        tmp_path / "kc", 'server: https://kube.example\ninsecure-skip-tls-verify: "false"'
    )
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "--store", "kubernetes", "--lease", "l",
         "--kubeconfig", str(config), "--listen", "127.0.0.1:0",
         "--public-listen", "127.0.0.1:0"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "insecure-skip-tls-verify must be true or false (unquoted), not 'false'" in lines[0]
    assert SECRET not in done.stderr


def test_credentials_never_print_in_a_repr_or_an_error(tmp_path: Path) -> None:
    config = kubeconfig(
        tmp_path / "kc",
        "server: https://admin:hunter2@kube.example\nproxy-url: http://me:pr0xy-pw@proxy:3128",
    )
    connection = Kubeconfig.read(str(config)).connection({})
    shown = repr(connection)
    for secret in (SECRET, "hunter2", "pr0xy-pw", base64.b64encode(b"me:pr0xy-pw").decode()):
        assert secret not in shown
    assert repr(StaticHeader(f"Bearer {SECRET}")) == "StaticHeader(Bearer ***)"
    basic = kubeconfig(tmp_path / "basic", "server: https://k", "username: u\npassword: hunter2")
    assert "hunter2" not in repr(Kubeconfig.read(str(basic)).connection({}))
    assert asyncio.run(connection.credentials.headers()) == {"Authorization": f"Bearer {SECRET}"}
    error = CallError("get lease", 0, "ClientConnectorError", "via http://me:pr0xy-pw@proxy:3128")
    assert "pr0xy-pw" not in str(error)


def test_an_empty_token_file_is_refused_and_the_last_good_token_kept(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("\n")
    now = [0.0]
    source = TokenFile(path, clock=lambda: now[0])
    with pytest.raises(KubeconfigError, match="the file is empty"):
        source.token()
    path.write_text("first\n")
    now[0] += 61
    assert source.token() == "first"
    path.write_text("")  # the kubelet mid-rotation, or a bad mount
    now[0] += 61
    assert source.token() == "first"
    path.unlink()
    now[0] += 61
    assert source.token() == "first"


def test_a_token_beside_a_token_file_is_used_until_the_file_gives_one(tmp_path: Path) -> None:
    """client-go: the file is the source (read again every minute); the token is what is sent
    while the file cannot be read."""
    config = kubeconfig(
        tmp_path / "kc", "server: https://kube.example", "token: inline\ntokenFile: token"
    )
    credentials = Kubeconfig.read(str(config)).connection({}).credentials
    assert asyncio.run(credentials.headers()) == {"Authorization": "Bearer inline"}
    (tmp_path / "token").write_text("from-file\n")
    assert asyncio.run(credentials.refresh()) is True
    assert asyncio.run(credentials.headers()) == {"Authorization": "Bearer from-file"}


def test_missing_files_of_a_kubeconfig_list_are_skipped_as_kubectl_skips_them(
    tmp_path: Path,
) -> None:
    config = kubeconfig(tmp_path / "kc", "server: https://kube.example")
    missing = tmp_path / "nope"
    listed = Kubeconfig.read(f"{missing}:{config}:{tmp_path / 'gone'}")
    assert listed.namespace == "team-a"
    with pytest.raises(KubeconfigError, match="none of these files exists"):
        Kubeconfig.read(f"{missing}:{tmp_path / 'gone'}")
    with pytest.raises(KubeconfigError, match="cannot read it"):
        Kubeconfig.read(str(missing))  # one file named on its own must exist
    loaded = load(["--store", "kubernetes", "--lease", "l"], {"KUBECONFIG": f"{missing}:{config}"})
    assert loaded.namespace == "team-a"


def test_impersonation_becomes_the_headers_client_go_sends(tmp_path: Path) -> None:
    config = kubeconfig(
        tmp_path / "kc",
        "server: https://kube.example",
        "token: t\nas: alice\nas-uid: '42'\nas-groups: [team-a, team-b]\n"
        "as-user-extra: {example.com/reason: [on-call, 'audit 1']}",
    )
    assert Kubeconfig.read(str(config)).connection({}).impersonation == (
        ("Impersonate-User", "alice"),
        ("Impersonate-Uid", "42"),
        ("Impersonate-Group", "team-a"),
        ("Impersonate-Group", "team-b"),
        ("Impersonate-Extra-example.com%2Freason", "on-call"),
        ("Impersonate-Extra-example.com%2Freason", "audit 1"),
    )
    assert header_key_escape("a%b c") == "a%25b%20c"


@pytest.mark.parametrize(
    ("user", "why"),
    [
        ("as-groups: [team-a]", "requesting uid, groups or user-extra without impersonating"),
        ("as-uid: '1'", "requesting uid, groups or user-extra without impersonating"),
        ("as: alice\nas-groups: team-a", "as-groups must be a list of strings"),
        ("as: [alice]", "as must be a string"),
    ],
)
def test_impersonation_that_cannot_be_sent_is_refused_at_start(
    tmp_path: Path, user: str, why: str
) -> None:
    config = kubeconfig(tmp_path / "kc", "server: https://kube.example", f"token: t\n{user}")
    with pytest.raises(ConfigError, match=why):
        load(["--store", "kubernetes", "--lease", "l", "--kubeconfig", str(config)], {})


def test_a_client_certificate_kubeconfig_never_prints_its_key(tmp_path: Path) -> None:
    tls = TlsFiles.make(tmp_path)
    key = tls.client_key.read_bytes()
    config = kubeconfig(
        tmp_path / "kc",
        f"server: https://kube.example\ncertificate-authority: {tls.ca_cert}",
        f"client-certificate: {tls.client_cert}\nclient-key-data: {base64.b64encode(key).decode()}",
    )
    shown = repr(Kubeconfig.read(str(config)).connection({}))
    assert base64.b64encode(key).decode()[:40] not in shown
    assert "PRIVATE KEY" not in shown
