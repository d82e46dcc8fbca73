"""Real PostgreSQL servers for tests: Debian's ``postgresql-15``, never the packaged service.

Each server is ``initdb`` in a temporary directory and ``postgres`` in the foreground as a child
of the test run, on a free loopback port, with its socket in that directory. The server refuses
to run as root: when the tests run as root (CI, this machine) both run as the ``postgres`` user
(``runuser``), and the directory is handed to that user. Authentication is ``scram-sha-256``
over TCP (the superuser ``postgres`` has a password, so the tests exercise real passwords) and
``trust`` on the socket.

`shared_server()` is the one server of a test session (started on first use, stopped by the
root conftest at the end); each test takes a database of its own on it (`new_database`), so
tests stay independent. Tests that stop, pause or fail over a server start their own
(`PostgresServer.start`, `standby_of`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.tools import find_binary, require_binary

READY_TIMEOUT = 30.0
SUPERUSER = "postgres"
RUN_AS = "postgres"  # the OS user the server runs as when the tests run as root


def bin_dir() -> Path | None:
    """Where Debian keeps the server's binaries (not on PATH): the newest version's; else
    wherever ``initdb`` is on PATH (another distribution's packages)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if versions:
        return versions[0].parent
    found = find_binary("initdb")
    return Path(found).resolve().parent if found else None


def binary(name: str) -> str:
    """A server binary's path; a missing server skips (fails with ``CI=true``)."""
    directory = bin_dir()
    if directory is None or not (directory / name).is_file():
        require_binary(f"postgresql-15 ({name})")  # skips, or fails in CI
    assert directory is not None
    return str(directory / name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_root() -> bool:
    return os.geteuid() == 0


def _run_as_server_user(args: Sequence[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *args] if _as_root() else list(args)


def _hand_over(path: Path) -> None:
    """Give ``path`` to the user the server runs as (a no-op when not root)."""
    if _as_root():
        shutil.chown(path, RUN_AS, RUN_AS)


def make_directory(prefix: str) -> Path:
    """A temporary directory the server's user may enter (its parents are /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


class PostgresServer:
    """One ``postgres`` child process on ``127.0.0.1:port`` with its data in ``directory``."""

    def __init__(self, directory: Path, port: int, password: str) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.port = port
        self.password = password
        self.log = directory / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.settings: dict[str, str] = {}

    # -- life cycle -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path | None = None,
        *,
        settings: dict[str, str] | None = None,
        hba: Sequence[str] = (),
    ) -> PostgresServer:
        """``initdb`` a fresh cluster and start it. ``settings``: extra ``-c`` options;
        ``hba``: lines put first in ``pg_hba.conf``."""
        directory = directory or make_directory("pg-")
        password = secrets.token_hex(12)
        server = cls(directory, free_port(), password)
        server.initdb(hba)
        server.settings = dict(settings or {})
        try:
            server.launch()
        except BaseException:  # never leave a half-started server behind
            server.destroy()
            raise
        return server

    def initdb(self, hba: Sequence[str] = ()) -> None:
        _hand_over(self.directory)
        pwfile = self.directory / "pwfile"
        pwfile.write_text(self.password + "\n")
        _hand_over(pwfile)
        result = subprocess.run(
            _run_as_server_user(
                [
                    binary("initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    SUPERUSER,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--no-sync",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                ]
            ),
            capture_output=True,
            text=True,
        )
        pwfile.unlink()
        if result.returncode != 0:
            raise AssertionError(f"initdb failed: {result.stderr[-2000:]}")
        if hba:
            conf = self.data / "pg_hba.conf"
            conf.write_text("\n".join(hba) + "\n" + conf.read_text())
        # Replication over TCP for standbys (pg_basebackup, streaming) as the superuser.
        with (self.data / "pg_hba.conf").open("a") as conf:
            conf.write("host replication all 127.0.0.1/32 scram-sha-256\n")

    def launch(self) -> None:
        """Start the server on its port; ready (accepting connections) when it returns."""
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.directory),
            "fsync": "off",  # tests never survive a power cut; a standby test crashes a process
            "full_page_writes": "off",
            "synchronous_commit": "off",
            "shared_buffers": "16MB",
            "max_connections": "300",
            "wal_level": "replica",
            "max_wal_senders": "4",
            "logging_collector": "off",
            **self.settings,
        }
        args = [binary("postgres"), "-D", str(self.data)]
        for key, value in options.items():
            args += ["-c", f"{key}={value}"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                _run_as_server_user(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.wait_ready()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"postgres exited; log:\n{self.log_tail()}")
            if self.psql("SELECT 1", check=False).returncode == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"postgres not ready within {timeout}s; log:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        """The postmaster's pid (from ``postmaster.pid``: under ``runuser`` the child we
        started is runuser itself)."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: the server answers nothing."""
        for pid in self._tree():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        # runuser stops itself when its child stops (as su does) and must be continued too,
        # or it never reaps the postmaster.
        pids = [self.proc.pid] if self.proc is not None else []
        if (self.data / "postmaster.pid").exists():
            pids += self._tree()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _tree(self) -> list[int]:
        """The postmaster and its children (the backends and helpers)."""
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True
        ).stdout
        return [self.pid, *(int(p) for p in out.split())]

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: a fast shutdown; SIGKILL: a crash (the backends then die with it)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            postmaster = self.pid
        except (OSError, ValueError):  # not written yet, or gone: stop what we started
            postmaster = self.proc.pid
        children = self._tree()[1:] if postmaster != self.proc.pid else []
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, sig)
        if sig == signal.SIGKILL:
            for pid in children:  # orphaned backends would keep the port and shared memory
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            for pid in (postmaster, self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(10)
        if sig == signal.SIGKILL:
            self._wait_children_gone(children)

    @staticmethod
    def _wait_children_gone(pids: list[int], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.02)

    def restart(self, sig: int = signal.SIGINT) -> None:
        """Stop (fast, or a crash with SIGKILL) and start again on the same port, data kept."""
        self.stop(sig)
        self.launch()

    def destroy(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- talking to it ----------------------------------------------------------------------

    def url(
        self,
        database: str = "postgres",
        user: str = SUPERUSER,
        password: str | None = None,
        **query: str,
    ) -> str:
        secret = self.password if password is None and user == SUPERUSER else password
        auth = f"{user}:{secret}" if secret else user
        tail = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}" + (
            f"?{tail}" if tail else ""
        )

    def psql(
        self, sql: str, database: str = "postgres", *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``sql`` as the superuser over the socket (trust); output unaligned, no headers."""
        result = subprocess.run(
            [
                binary("psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.directory),
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"psql {sql!r}: {result.stderr.strip()}")
        return result

    def value(self, sql: str, database: str = "postgres") -> str:
        return self.psql(sql, database).stdout.strip()

    def new_database(self, prefix: str = "t") -> str:
        name = f"{prefix}_{secrets.token_hex(6)}"
        self.psql(f"CREATE DATABASE {name}")
        return name

    def terminate_sessions(
        self, database: str | None = None, application: str = "leader-sidecar%"
    ) -> int:
        """``pg_terminate_backend`` of every session whose application_name matches."""
        where = f"application_name LIKE '{application}'"
        if database:
            where += f" AND datname = '{database}'"
        return int(
            self.value(
                f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {where}"
            )
            or 0
        )

    # -- replication ----------------------------------------------------------------------

    def standby(
        self, directory: Path | None = None, *, via_port: int | None = None
    ) -> PostgresServer:
        """A streaming standby of this server (``pg_basebackup -R``), started. ``via_port``:
        it streams through that port (a proxy the test can cut) instead of the primary's."""
        directory = directory or make_directory("pg-standby-")
        _hand_over(directory)
        standby = PostgresServer(directory, free_port(), self.password)
        env = {**os.environ, "PGPASSWORD": self.password}
        result = subprocess.run(
            _run_as_server_user(
                [
                    "env",
                    f"PGPASSWORD={self.password}",
                    binary("pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    SUPERUSER,
                    "-D",
                    str(standby.data),
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                    "--checkpoint=fast",
                ]
            ),
            capture_output=True,
            text=True,
            env=env,
        )
        if result.returncode != 0:
            raise AssertionError(f"pg_basebackup failed: {result.stderr[-2000:]}")
        if via_port is not None:
            conf = standby.data / "postgresql.auto.conf"
            conf.write_text(conf.read_text().replace(f"port={self.port}", f"port={via_port}"))
        try:
            standby.launch()
        except BaseException:
            standby.destroy()
            raise
        return standby

    def promote(self) -> None:
        self.psql("SELECT pg_promote(wait => true)")

    def replay_lsn(self) -> str:
        return self.value("SELECT pg_last_wal_replay_lsn()")

    def current_lsn(self) -> str:
        return self.value("SELECT pg_current_wal_lsn()")


_SHARED: PostgresServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_server() -> PostgresServer:
    """The session's server, started on first use; `stop_shared_server` ends it."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.proc is None or _SHARED.proc.poll() is not None:
            _SHARED = PostgresServer.start()
        return _SHARED


def stop_shared_server() -> None:
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is not None:
            _SHARED.destroy()
            _SHARED = None


@contextlib.contextmanager
def database_url() -> Iterator[tuple[PostgresServer, str]]:
    """A fresh database on the session's server: (server, superuser URL)."""
    server = shared_server()
    name = server.new_database()
    try:
        yield server, server.url(name)
    finally:
        server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)
