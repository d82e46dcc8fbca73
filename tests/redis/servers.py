"""Real ``redis-server`` and ``redis-sentinel`` processes for tests.

Each server gets a free loopback port and its own temporary directory (config, log, nothing
persisted), runs in the foreground as a child of the test (so it is stopped by its pid and
never outlives the test run), and is ready when `start` returns. Helpers cover what the tests
do to a store: pause it (SIGSTOP), restart it empty on the same port, make it a replica, make
a CA and certificates for TLS.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import redis

from tests.support.tools import require_binary

READY_TIMEOUT = 10.0


def free_port() -> int:
    """A port nothing listens on right now (the server may still lose a race for it: `start`
    retries on another port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(interval)


class RedisServer:
    """One ``redis-server`` (or ``redis-sentinel``) child process."""

    # Extra environment for the server process (a subclass sets it, e.g. an LD_PRELOAD shim).
    ENV: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        directory: Path,
        args: Sequence[str],
        *,
        port: int,
        tls_port: int | None = None,
        sentinel: bool = False,
        client_kwargs: dict[str, object] | None = None,
    ) -> None:
        self.directory = directory
        self.args = list(args)
        self.port = port
        self.tls_port = tls_port
        self.sentinel = sentinel
        self.client_kwargs = client_kwargs or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "server.log"

    # -- life cycle -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path,
        extra: Sequence[str] = (),
        *,
        port: int | None = None,
        tls: TlsFiles | None = None,
        tls_auth_clients: bool = False,
        password: str | None = None,
    ) -> RedisServer:
        """A fresh, empty, non-persistent server. With ``tls``, the plain port is closed and
        only ``tls_port`` listens."""
        binary = require_binary("redis-server")
        for _attempt in range(5):
            chosen = port or free_port()
            args = [
                binary,
                "--port", "0" if tls else str(chosen),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(directory),
                "--logfile", str(directory / "server.log"),
                "--daemonize", "no",
                # A replica's first sync starts at once (the default waits 5 s for more
                # replicas to share a diskless transfer).
                "--repl-diskless-sync-delay", "0",
            ]  # fmt: skip
            client_kwargs: dict[str, object] = {}
            if password:
                args += ["--requirepass", password]
                client_kwargs["password"] = password
            if tls:
                args += [
                    "--tls-port", str(chosen),
                    "--tls-cert-file", str(tls.server_cert),
                    "--tls-key-file", str(tls.server_key),
                    "--tls-ca-cert-file", str(tls.ca_cert),
                    "--tls-auth-clients", "yes" if tls_auth_clients else "no",
                ]  # fmt: skip
                client_kwargs.update(
                    ssl=True,
                    ssl_ca_certs=str(tls.ca_cert),
                    ssl_certfile=str(tls.client_cert),
                    ssl_keyfile=str(tls.client_key),
                )
            server = cls(
                directory,
                [*args, *extra],
                port=chosen,
                tls_port=chosen if tls else None,
                client_kwargs=client_kwargs,
            )
            if server._launch():
                return server
            if port is not None:
                break
        raise AssertionError(f"redis-server did not start; log:\n{server.log_tail()}")

    @classmethod
    def start_sentinel(
        cls,
        directory: Path,
        master: RedisServer,
        name: str = "m",
        *,
        down_after_ms: int = 1000,
        password: str | None = None,
    ) -> RedisServer:
        """A sentinel monitoring ``master`` with quorum 1. It rewrites its config file, so the
        file lives in its own directory."""
        binary = require_binary("redis-sentinel")
        for _attempt in range(5):
            chosen = free_port()
            config = directory / "sentinel.conf"
            config.write_text(
                f"port {chosen}\n"
                "bind 127.0.0.1\n"
                f"dir {directory}\n"
                f"logfile {directory / 'server.log'}\n"
                "daemonize no\n"
                f"sentinel monitor {name} 127.0.0.1 {master.port} 1\n"
                f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                f"sentinel failover-timeout {name} 10000\n"
                + (f"requirepass {password}\n" if password else "")
            )
            server = cls(
                directory,
                [binary, str(config)],
                port=chosen,
                sentinel=True,
                client_kwargs={"password": password} if password else None,
            )
            if server._launch():
                return server
        raise AssertionError(f"redis-sentinel did not start; log:\n{server.log_tail()}")

    def _launch(self) -> bool:
        self.log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the test run is not delivered twice
            env={**os.environ, **self.ENV} if self.ENV else None,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # e.g. the port was taken meanwhile
            with contextlib.suppress(redis.RedisError, OSError), self.client() as client:
                if client.ping():
                    return True
            time.sleep(0.01)
        self.stop()
        return False

    def client(self, **kwargs: object) -> redis.Redis:
        """A synchronous client for checks and setup (not the code under test)."""
        options: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "decode_responses": True,
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
            **self.client_kwargs,
            **kwargs,
        }
        return redis.Redis(**options)  # type: ignore[arg-type]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls_port else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Gone, whatever state it was in (paused included)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(5)

    def restart(self) -> None:
        """Stop and start again on the same port, empty (nothing was persisted)."""
        self.stop()
        if not self._launch():
            raise AssertionError(f"redis-server did not restart; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- replication ----------------------------------------------------------------------

    def replicate(self, master: RedisServer, timeout: float = 10.0) -> None:
        """Become a replica of ``master`` and wait until both sides see the link up: after a
        diskless sync the master counts the replica (for WAIT) only after its first ack."""
        with self.client() as client:
            client.replicaof("127.0.0.1", master.port)
        self.wait_replica_linked(timeout)

        def online() -> bool:
            with master.client() as client:
                info = client.info("replication")
            return any(
                isinstance(v, dict) and v.get("port") == self.port and v.get("state") == "online"
                for v in info.values()
            )

        wait_until(online, timeout, f"master :{master.port} counts replica :{self.port}")
        # The first WAIT after a sync can take until the replica's periodic ack (1 s); have it
        # happen here rather than in the test.
        with master.client() as client:
            client.set("tests:warm-up", self.port)
            replicas = int(client.info("replication")["connected_slaves"])
            assert client.wait(replicas, int(timeout * 1000)) >= replicas

    def wait_replica_linked(self, timeout: float = 10.0) -> None:
        with self.client() as client:
            wait_until(
                lambda: client.info("replication").get("master_link_status") == "up",
                timeout,
                f"replica :{self.port} linked to its master",
            )

    def role(self) -> str:
        with self.client() as client:
            return str(client.execute_command("ROLE")[0])


@contextlib.contextmanager
def redis_server(extra: Sequence[str] = (), **kwargs: object) -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="redis-") as tmp:
        server = RedisServer.start(Path(tmp), extra, **kwargs)  # type: ignore[arg-type]
        try:
            yield server
        finally:
            server.stop()


class SentinelGroup:
    """A primary, its replicas and one sentinel (quorum 1), all on loopback."""

    def __init__(self, primary: RedisServer, replicas: list[RedisServer], sentinel: RedisServer):
        self.servers = [primary, *replicas]
        self.sentinel = sentinel
        self.name = "m"

    def url(self, db: int = 0) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.name}/{db}"

    def master(self) -> RedisServer:
        """The server the sentinel currently names as master."""
        with self.sentinel.client() as client:
            _host, port = client.sentinel_get_master_addr_by_name(self.name)
        return next(s for s in self.servers if s.port == int(port))

    def replicas(self) -> list[RedisServer]:
        master = self.master()
        return [s for s in self.servers if s is not master]

    def wait_sentinel_knows_replicas(self, count: int, timeout: float = 15.0) -> None:
        def known() -> bool:
            with self.sentinel.client() as client:
                replicas = client.sentinel_slaves(self.name)
            up = [
                r
                for r in replicas
                if not r.get("is_sdown") and r.get("master-link-status") in ("ok", None)
            ]
            return len(up) >= count

        wait_until(known, timeout, f"sentinel sees {count} replica(s)", interval=0.1)

    def failover(self) -> RedisServer:
        """``SENTINEL FAILOVER``; returns the old master."""
        old = self.master()
        with self.sentinel.client() as client:
            client.execute_command("SENTINEL", "FAILOVER", self.name)
        return old

    def wait_master_is_not(self, old: RedisServer, timeout: float = 10.0) -> RedisServer:
        wait_until(lambda: self.master() is not old, timeout, "sentinel announced a new master")
        return self.master()


@contextlib.contextmanager
def sentinel_group(
    replicas: int = 1, sentinel_password: str | None = None
) -> Iterator[SentinelGroup]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="redis-sentinel-")))
        started: list[RedisServer] = []
        stack.callback(lambda: [server.stop() for server in reversed(started)])
        for index in range(replicas + 1):
            directory = tmp / f"redis-{index}"
            directory.mkdir()
            started.append(RedisServer.start(directory))
        primary, *others = started
        for replica in others:
            replica.replicate(primary)
        sentinel_dir = tmp / "sentinel"
        sentinel_dir.mkdir()
        sentinel = RedisServer.start_sentinel(sentinel_dir, primary, password=sentinel_password)
        started.append(sentinel)
        group = SentinelGroup(primary, others, sentinel)
        group.wait_sentinel_knows_replicas(replicas)
        yield group


# -- TLS material -----------------------------------------------------------------------------


class TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made with
    the ``openssl`` command line (present on every Debian with ca-certificates)."""

    def __init__(self, directory: Path, name: str = "test") -> None:
        self.directory = directory
        self.ca_cert = directory / f"{name}-ca.crt"
        self.ca_key = directory / f"{name}-ca.key"
        self.server_cert = directory / f"{name}-server.crt"
        self.server_key = directory / f"{name}-server.key"
        self.client_cert = directory / f"{name}-client.crt"
        self.client_key = directory / f"{name}-client.key"

    @classmethod
    def make(cls, directory: Path, name: str = "test") -> TlsFiles:
        openssl = require_binary("openssl")
        files = cls(directory, name)

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={name} test CA", "-keyout", str(files.ca_key),
            "-out", str(files.ca_cert))  # fmt: skip
        for role, cert, key, ext in (
            ("server", files.server_cert, files.server_key,
             "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
            ("client", files.client_cert, files.client_key,
             "extendedKeyUsage=clientAuth\n"),
        ):  # fmt: skip
            csr = directory / f"{name}-{role}.csr"
            extfile = directory / f"{name}-{role}.ext"
            extfile.write_text(ext)
            run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name} {role}",
                "-keyout", str(key), "-out", str(csr))  # fmt: skip
            run("x509", "-req", "-in", str(csr), "-CA", str(files.ca_cert),
                "-CAkey", str(files.ca_key), "-CAcreateserial", "-days", "2",
                "-extfile", str(extfile), "-out", str(cert))  # fmt: skip
        return files
