"""Real ZooKeeper servers for tests: Debian's ``zookeeper`` package (3.8), started straight from
its jars with ``java`` (the package's ``zkServer.sh`` reads /etc/zookeeper and logs to
/var/log/zookeeper; the tests keep everything in a temporary directory of their own).

* `Standalone` — one server (``ZooKeeperServerMain``).
* `Ensemble` — three members (``QuorumPeerMain``), each with its own data directory, client,
  quorum and election ports on loopback.

Settings every test server shares: ``tickTime`` 100 ms (sessions of 0.2-4 s, followers that
lose their leader give up within ``syncLimit`` ticks), election notifications capped at 1 s
(``zookeeper.cnxTimeout`` and the notification back-off), the four-letter words allowed
(``ruok``/``srvr``/``stat`` tell whether a member serves and in which mode), no AdminServer,
and a JVM of at most 128 MiB: five servers stay well under a gigabyte on a shared machine.

A test session shares one standalone server (`shared_standalone`, started on first use,
stopped when the interpreter exits); each test keeps to its own chroot. Tests that hurt a
server start one of their own (`standalone`, `ensemble`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.ports import free_ports
from tests.support.tools import require_binary

READY_TIMEOUT = 30.0
TICK_MS = 100
# The package's jar names the rest of its class path in its manifest; slf4j-simple gives the
# server a log (without a binding it logs nothing at all), at WARN to keep it short.
JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
HEAP = "128m"


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """A four-letter command's answer (``ruok``, ``srvr``, ``stat``, ``mntr``); "" when the
    server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def java() -> str:
    """The JVM, with the package's jars present (skip or fail as `require_binary` does)."""
    path = require_binary("java")
    missing = [jar for jar in JARS if not Path(jar).is_file()]
    if missing:
        message = f"{', '.join(missing)} missing: run scripts/setup-test-env"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


class Server:
    """One ZooKeeper process: its ports, data directory, config and log."""

    def __init__(self, directory: Path, name: str, client_port: int) -> None:
        self.name = name
        self.client_port = client_port
        self.directory = directory / name
        self.data_dir = self.directory / "data"
        self.config = self.directory / "zoo.cfg"
        self.log = self.directory / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.main_class = "org.apache.zookeeper.server.ZooKeeperServerMain"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def settings(self) -> dict[str, str]:
        return {
            "tickTime": str(TICK_MS),
            "initLimit": "20",
            "syncLimit": "5",
            "dataDir": str(self.data_dir),
            "clientPort": str(self.client_port),
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": "0",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "*",
            # Sessions up to 40 ticks (4 s): a test's client asks for what its store uses.
            "minSessionTimeout": str(2 * TICK_MS),
            "maxSessionTimeout": str(40 * TICK_MS),
            "autopurge.purgeInterval": "0",
        }

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.settings().items()]
        self.config.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [
            java(),
            f"-Xmx{HEAP}",
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # starts in about a second instead of three
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dzookeeper.admin.enableServer=false",
            # Elections within a second: connecting to a stopped member gives up after 1 s,
            # and the notification back-off stops at 1 s.
            "-Dzookeeper.cnxTimeout=1000",
            "-Dzookeeper.fastleader.maxNotificationInterval=1000",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            ":".join(JARS),
            self.main_class,
            str(self.config),
        ]

    def launch(self) -> None:
        self.write_config()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
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

    def mode(self) -> str:
        """``standalone``, ``leader``, ``follower``, or "" (not serving: no quorum, stopped,
        paused, still starting)."""
        for line in four_letter(self.client_port, "srvr").splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return ""

    def serving(self) -> bool:
        return self.mode() != ""

    def wait_serving(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.serving():
            if not self.running():
                raise AssertionError(f"zookeeper {self.name} exited:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"zookeeper {self.name} not serving within {timeout:g}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL (a paused server too); returns once it is gone."""
        if not self.running():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            os.kill(self.pid, signal.SIGCONT)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        if not self.running():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same data directory."""
        self.kill()
        self.launch()

    def wipe(self) -> None:
        """Kill it and delete its data (a server that lost its disk); `launch` starts empty."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Standalone(Server):
    """One server on its own (``ZooKeeperServerMain``)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, "standalone", free_ports(1)[0])

    @classmethod
    def start(cls, directory: Path) -> Standalone:
        server = cls(directory)
        server.launch()
        try:
            server.wait_serving()
        except BaseException:
            server.kill()
            raise
        return server

    def url(self, chroot: str = "") -> str:
        return f"zookeeper://{self.endpoint}{chroot}"


class Member(Server):
    """One member of an `Ensemble` (``QuorumPeerMain``, ``myid`` 1-3)."""

    def __init__(self, ensemble: Ensemble, myid: int, ports: Sequence[int]) -> None:
        super().__init__(ensemble.directory, f"m{myid}", ports[0])
        self.ensemble = ensemble
        self.myid = myid
        self.quorum_port, self.election_port = ports[1], ports[2]
        self.main_class = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        self.peers: dict[int, tuple[int, int]] = {}
        """Where this member looks for the others (myid → quorum and election ports), when
        not where they are (`isolate`)."""

    def settings(self) -> dict[str, str]:
        settings = super().settings()
        for member in self.ensemble.members:
            quorum, election = (
                (self.quorum_port, self.election_port)
                if member is self
                else self.peers.get(member.myid, (member.quorum_port, member.election_port))
            )
            settings[f"server.{member.myid}"] = f"127.0.0.1:{quorum}:{election}"
        return settings

    def isolate(self) -> None:
        """Restart it cut off from the others, its clients' port unchanged: its quorum and
        election ports move where the others do not look, and it looks for them where nobody
        listens. It runs and never serves (a minority of one) while the others go on: a
        partition on loopback, no firewall needed."""
        self.kill()
        others = [m for m in self.ensemble.members if m is not self]
        ports = free_ports(2 + 2 * len(others))
        self.quorum_port, self.election_port = ports[0], ports[1]
        self.peers = {
            member.myid: (ports[2 + 2 * index], ports[3 + 2 * index])
            for index, member in enumerate(others)
        }
        self.launch()

    def write_config(self) -> None:
        super().write_config()
        (self.data_dir / "myid").write_text(f"{self.myid}\n")


class Ensemble:
    """Three members on loopback, each with its own data directory."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        self.directory = directory
        ports = free_ports(3 * size)
        self.members: list[Member] = []
        for index in range(size):
            self.members.append(Member(self, index + 1, ports[3 * index : 3 * index + 3]))

    @classmethod
    def start(cls, directory: Path, size: int = 3) -> Ensemble:
        ensemble = cls(directory, size)
        for member in ensemble.members:
            member.launch()
        try:
            ensemble.wait_serving()
        except BaseException:
            ensemble.stop()
            raise
        return ensemble

    def wait_serving(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every running member serves (a leader is elected and they follow it)."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            if member.running():
                member.wait_serving(max(0.1, deadline - time.monotonic()))

    def restore_empty(self) -> None:
        """Every member killed and its data directory deleted, then started again on the same
        ports: an ensemble restored from nothing (no znode, zxids from zero again). Returns
        once it serves."""
        for member in self.members:
            member.wipe()
        for member in self.members:
            member.launch()
        self.wait_serving()

    def leader(self) -> Member:
        for member in self.members:
            if member.mode() == "leader":
                return member
        raise AssertionError("no member leads: " + ", ".join(m.mode() or "-" for m in self.members))

    def stop(self) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):
                member.kill()

    def url(self, chroot: str = "", members: Sequence[Member] | None = None) -> str:
        """The ``--store`` URL of these members (all by default), under ``chroot``."""
        chosen = self.members if members is None else members
        return f"zookeeper://{','.join(m.endpoint for m in chosen)}{chroot}"


_SHARED: Standalone | None = None


def shared_standalone() -> Standalone:
    """The session's standalone server, started on first use; each test keeps to its own
    chroot (`fresh_chroot`)."""
    global _SHARED
    if _SHARED is None or not _SHARED.running():
        directory = Path(tempfile.mkdtemp(prefix="zookeeper-shared-"))
        _SHARED = Standalone.start(directory)
        atexit.register(_stop_shared, _SHARED, directory)
    return _SHARED


def _stop_shared(server: Standalone, directory: Path) -> None:
    server.kill()
    shutil.rmtree(directory, ignore_errors=True)


def fresh_chroot(label: str = "t") -> str:
    """A chroot no other test uses."""
    return f"/test-{label}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def standalone() -> Iterator[Standalone]:
    """A server of its own for a test that hurts it."""
    with tempfile.TemporaryDirectory(prefix="zookeeper-") as tmp:
        server = Standalone.start(Path(tmp))
        try:
            yield server
        finally:
            server.kill()


@contextlib.contextmanager
def ensemble(size: int = 3) -> Iterator[Ensemble]:
    """An ensemble of its own."""
    with tempfile.TemporaryDirectory(prefix="zookeeper-ensemble-") as tmp:
        started = Ensemble.start(Path(tmp), size)
        try:
            yield started
        finally:
            started.stop()
