"""Real etcd clusters for tests: three members (Debian's ``etcd-server``) on free loopback
ports, each a child process with its own data directory.

A test session shares one cluster (`shared_cluster`, started on first use, stopped when the
session's interpreter exits); each test keeps to its own key prefix, so tests stay independent
on it. Tests that hurt a cluster (kill, pause, restore a snapshot) start one of their own
(`EtcdCluster.start`). Helpers cover what the tests do to a cluster: SIGKILL / SIGSTOP one
member or the Raft leader, take a quorum away, save a snapshot and restore every member from
it, TLS with client certificates, users and roles.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.redis.servers import TlsFiles
from tests.support.ports import free_ports
from tests.support.tools import require_binary

READY_TIMEOUT = 20.0


class Member:
    """One etcd member: its name, ports, data directory and process."""

    def __init__(self, cluster: EtcdCluster, name: str, client_port: int, peer_port: int) -> None:
        self.cluster = cluster
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        # The peer port the others reach it on: its own, or a proxy's in front of it (a
        # partition of this member, tests/chaos).
        self.advertised_peer_port = peer_port
        self.data_dir = cluster.directory / f"{name}.etcd"
        self.log = cluster.directory / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.cluster.tls else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """Where the others reach it (its own peer port, or a proxy in front of it)."""
        return f"http://127.0.0.1:{self.advertised_peer_port}"

    @property
    def listen_peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def args(self, state: str) -> list[str]:
        cluster = self.cluster
        args = [
            require_binary("etcd"),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.listen_peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", cluster.initial_cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", cluster.token,
            # Fast elections: a test waits for a new Raft leader in about a second.
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--snapshot-count", "10000",
            # Not a warning per slow request: on a busy test machine that is most of them,
            # and the logging itself slows the member down further.
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "error",
            "--quota-backend-bytes", str(256 * 1024 * 1024),
        ]  # fmt: skip
        if cluster.tls is not None:
            args += [
                "--cert-file", str(cluster.tls.server_cert),
                "--key-file", str(cluster.tls.server_key),
                "--trusted-ca-file", str(cluster.tls.ca_cert),
                "--client-cert-auth",
            ]  # fmt: skip
        return args

    def launch(self, state: str = "new") -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args(state),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C of the test run is not delivered twice
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a paused member too); returns once it is gone."""
        if not self.running():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            os.kill(self.pid, signal.SIGCONT)
        self.proc.wait(10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same data directory (after `kill`)."""
        self.kill()
        self.launch("existing")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class EtcdCluster:
    """``size`` members on loopback (TLS with client certificates when ``tls`` is given)."""

    def __init__(self, directory: Path, size: int = 3, tls: TlsFiles | None = None) -> None:
        self.directory = directory
        self.tls = tls
        self.token = f"leader-sidecar-test-{uuid.uuid4().hex[:8]}"
        ports = free_ports(2 * size)
        self.members = [Member(self, f"m{i}", ports[2 * i], ports[2 * i + 1]) for i in range(size)]
        self.root_password: str | None = None

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @classmethod
    def start(cls, directory: Path, size: int = 3, tls: TlsFiles | None = None) -> EtcdCluster:
        return cls(directory, size, tls).launch()

    def launch(self) -> EtcdCluster:
        """Start every member (a new cluster) and wait until it serves."""
        cluster = self
        for member in cluster.members:
            member.launch()
        try:
            cluster.wait_ready()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):
                member.kill()

    # -- addresses -------------------------------------------------------------------------

    def url(self, prefix: str = "", members: Sequence[Member] | None = None, user: str = "") -> str:
        """The ``--store`` URL of these members (all by default), under ``prefix``."""
        chosen = self.members if members is None else members
        scheme = "etcds" if self.tls else "etcd"
        hosts = ",".join(m.endpoint for m in chosen)
        return f"{scheme}://{user + '@' if user else ''}{hosts}/{prefix}".rstrip("/")

    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members if m.running())

    # -- talking to it (setup and checks: etcdctl and the gateway, not the code under test) --

    def etcdctl(
        self, *args: str, endpoints: str | None = None, check: bool = True, timeout: float = 20.0
    ) -> str:
        """``etcdctl`` against ``endpoints`` (default: every running member)."""
        env = {**os.environ, "ETCDCTL_API": "3"}
        command = [require_binary("etcdctl"), "--endpoints", endpoints or self.endpoints()]
        command += ["--command-timeout", "5s"]
        if self.tls is not None:
            command += [
                "--cacert", str(self.tls.ca_cert),
                "--cert", str(self.tls.client_cert),
                "--key", str(self.tls.client_key),
            ]  # fmt: skip
        if self.root_password is not None:
            command += ["--user", f"root:{self.root_password}"]
        done = subprocess.run(
            [*command, *args], capture_output=True, env=env, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"etcdctl {' '.join(args)} failed: {done.stderr.decode(errors='replace')}"
            )
        return done.stdout.decode(errors="replace")

    def gateway(self, member: Member, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One gateway request (plain HTTP only), for readiness and checks."""
        request = urllib.request.Request(
            f"{member.client_url}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every running member serves a linearizable read (a leader is elected)."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            if not member.running():
                continue
            while True:
                if member.proc is not None and member.proc.poll() is not None:
                    raise AssertionError(f"etcd {member.name} exited:\n{member.log_tail()}")
                try:
                    if self.tls is not None or self.root_password is not None:
                        self.etcdctl("get", "ready-check", endpoints=member.endpoint)
                    else:
                        self.gateway(member, "/v3/kv/range", {"key": _b64("ready-check")})
                    break
                except (OSError, urllib.error.URLError, AssertionError, ValueError) as exc:
                    if time.monotonic() >= deadline:
                        raise AssertionError(
                            f"etcd {member.name} not ready within {timeout}s ({exc}):\n"
                            f"{member.log_tail()}"
                        ) from None
                    time.sleep(0.05)

    def leader(self) -> Member:
        """The member that is the Raft leader now (asked of every running member)."""
        for _ in range(100):
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired, ValueError):
                statuses = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
                for status in statuses:
                    header = status["Status"]["header"]
                    if status["Status"]["leader"] == header["member_id"]:
                        return next(m for m in self.members if m.endpoint == status["Endpoint"])
            time.sleep(0.1)
        raise AssertionError("no Raft leader")

    def enable_auth(self, password: str = "root-secret") -> None:
        self.etcdctl("user", "add", f"root:{password}")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("auth", "enable")
        self.root_password = password

    def add_user(self, name: str, password: str, prefix: str) -> None:
        """A user whose role may read and write everything under ``prefix``."""
        self.etcdctl("user", "add", f"{name}:{password}")
        self.etcdctl("role", "add", name)
        self.etcdctl("role", "grant-permission", name, "--prefix=true", "readwrite", prefix)
        self.etcdctl("user", "grant-role", name, name)

    # -- snapshots ---------------------------------------------------------------------------

    def save_snapshot(self, path: Path) -> None:
        self.etcdctl("snapshot", "save", str(path), endpoints=self.members[0].endpoint)

    def restore_snapshot(self, path: Path) -> None:
        """Every member stopped, restored from ``path`` (a new data directory each, as
        ``etcdctl snapshot restore`` makes it), and started again on the same ports."""
        self.stop()
        env = {**os.environ, "ETCDCTL_API": "3"}
        for member in self.members:
            shutil.rmtree(member.data_dir, ignore_errors=True)
            restore = [
                require_binary("etcdctl"), "snapshot", "restore", str(path),
                "--name", member.name,
                "--data-dir", str(member.data_dir),
                "--initial-cluster", self.initial_cluster,
                "--initial-cluster-token", self.token,
                "--initial-advertise-peer-urls", member.peer_url,
            ]  # fmt: skip
            subprocess.run(
                restore,
                check=True,
                capture_output=True,
                env=env,
                timeout=60,
            )
        for member in self.members:
            member.launch("new")
        self.wait_ready()


def etcd_tls_files(directory: Path, name: str) -> TlsFiles:
    """A CA and certificates for an etcd cluster with client certificate auth: the members'
    certificate may also act as a client (the gRPC gateway dials its own member with it), and
    the client certificate has no CommonName (the gateway refuses one with a CN when users
    are on: it cannot pass the CN on as the user)."""
    tls = TlsFiles.make(directory, name)
    openssl = require_binary("openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    for role, cert, key, subject, ext in (
        ("server", tls.server_cert, tls.server_key, f"/CN={name} etcd member",
         "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("client", tls.client_cert, tls.client_key, "/O=leader-sidecar",
         "extendedKeyUsage=clientAuth\n"),
    ):  # fmt: skip
        csr = directory / f"{name}-etcd-{role}.csr"
        extfile = directory / f"{name}-etcd-{role}.ext"
        extfile.write_text(ext)
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
        run("x509", "-req", "-in", str(csr), "-CA", str(tls.ca_cert),
            "-CAkey", str(tls.ca_key), "-CAcreateserial", "-days", "2",
            "-extfile", str(extfile), "-out", str(cert))  # fmt: skip
    return tls


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


_SHARED: EtcdCluster | None = None


def shared_cluster() -> EtcdCluster:
    """The session's cluster, started on first use; every test keeps to its own prefix."""
    global _SHARED
    if _SHARED is None or not all(m.running() for m in _SHARED.members):
        directory = Path(tempfile.mkdtemp(prefix="etcd-shared-"))
        _SHARED = EtcdCluster.start(directory)
        atexit.register(_stop_shared, _SHARED, directory)
    return _SHARED


def _stop_shared(cluster: EtcdCluster, directory: Path) -> None:
    cluster.stop()
    shutil.rmtree(directory, ignore_errors=True)


def fresh_prefix(label: str = "t") -> str:
    """A key prefix no other test uses."""
    return f"test-{label}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def etcd_cluster(size: int = 3, tls: TlsFiles | None = None) -> Iterator[EtcdCluster]:
    """A cluster of its own for a test that hurts it."""
    with tempfile.TemporaryDirectory(prefix="etcd-") as tmp:
        cluster = EtcdCluster.start(Path(tmp), size, tls)
        try:
            yield cluster
        finally:
            cluster.stop()
