"""Wake-ups between the processes that share one SQLite file: a hint, never a safety input.

A SQLite file tells nobody of a commit; a follower learns of one from its poller's
``PRAGMA data_version`` probe, every `watch_interval`. To cut that wait, each client that
watches binds a UNIX datagram socket in a directory beside the file, ``<file>-wake/``
(SQLite's own companions are ``<file>-wal``, ``<file>-shm``, ``<file>-journal``: the name
says whose it is and sorts beside them), and a client that made a write someone waits for
(a release, a hand-over, a renewal) sends one byte to every socket there. A receiver's poller
then looks at once. Lost, late or forged bytes cost only a look that finds nothing: the poll
stays, and what a follower does follows only from what it reads in the file.

Linux-only in practice (AF_UNIX datagram sockets); elsewhere, or when the directory cannot be
made or used, the clients only poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import socket
from collections.abc import Callable

logger = logging.getLogger("sidecar.sqlite")

MAX_PEERS = 256
"""Sockets one notice goes to, at most: a directory someone filled costs a bounded time."""

_SUN_PATH_MAX = 107  # bytes of a socket's path the kernel takes (108 with the NUL)


def wake_directory(path: str) -> str:
    return os.path.abspath(path) + "-wake"


def _address(directory: str, dir_fd: int, name: str) -> str:
    """The path to give the kernel: the real one, or, when that is too long for a socket
    address, the same file through ``/proc/self/fd`` and a descriptor of the directory."""
    full = os.path.join(directory, name)
    if len(os.fsencode(full)) <= _SUN_PATH_MAX:
        return full
    return f"/proc/self/fd/{dir_fd}/{name}"


class Notifier:
    """The sending side, used on the connection's thread after a write: one datagram to each
    socket in the directory, without waiting for any of them. Creates nothing."""

    def __init__(self, path: str) -> None:
        self._directory = wake_directory(path)
        self._socket: socket.socket | None = None
        self._dir_fd: int | None = None
        self._failed = False  # said once, at debug
        self.sent = 0  # datagrams sent (tests count them)

    def notify(self) -> None:
        if self._failed or not hasattr(socket, "AF_UNIX"):
            return
        try:
            names = self._peers()
        except OSError:
            return  # no directory (nobody watches), or one we cannot read
        if self._socket is None:
            try:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)
            except OSError as exc:
                self._fail(exc)
                return
        assert self._dir_fd is not None
        for name in names:
            address = _address(self._directory, self._dir_fd, name)
            try:
                self._socket.sendto(b"!", address)
                self.sent += 1
            except ConnectionRefusedError:
                # Nobody is bound to it: its process died without removing it.
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self._dir_fd)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.ENOENT, errno.EACCES):
                    logger.debug("a wake-up was not sent: %s", exc)

    def _peers(self) -> list[str]:
        if self._dir_fd is None:
            self._dir_fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        names = []
        with os.scandir(self._dir_fd) as entries:
            for entry in entries:
                if entry.name.endswith(".sock"):
                    names.append(entry.name)
                    if len(names) >= MAX_PEERS:
                        break
        return names

    def _fail(self, exc: OSError) -> None:
        self._failed = True
        logger.debug("SQLite wake-ups are off; followers poll: %s", exc)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


class Listener:
    """The receiving side: a socket of this client's in the directory (made if missing, 0700),
    read on the event loop; ``woken`` is called once per batch of datagrams read."""

    def __init__(self, path: str) -> None:
        self._directory = wake_directory(path)
        self._socket: socket.socket | None = None
        self._name: str | None = None
        self._dir_fd: int | None = None
        self._told = False  # "wake-ups are off" said once

    @property
    def listening(self) -> bool:
        return self._socket is not None

    def start(self, woken: Callable[[], None]) -> None:
        """Bind and read; on any failure, say so once and leave the poll alone to do it."""
        if self._socket is not None or not hasattr(socket, "AF_UNIX"):
            return
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self._directory, 0o700)
            dir_fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            self._off(exc)
            return
        name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            # (Its mode is the umask's: the directory's 0700 is the guard. Not a umask of its
            # own: that is the process's, and another thread may be creating a file.)
            sock.bind(_address(self._directory, dir_fd, name))
        except OSError as exc:
            sock.close()
            os.close(dir_fd)
            self._off(exc)
            return

        def readable() -> None:
            while True:
                try:
                    sock.recv(64)
                except OSError:  # (BlockingIOError: all read)
                    break
            woken()

        asyncio.get_running_loop().add_reader(sock.fileno(), readable)
        self._socket, self._name, self._dir_fd = sock, name, dir_fd

    def _off(self, exc: OSError) -> None:
        if not self._told:
            self._told = True
            logger.info(
                "SQLite wake-ups are off: followers learn of writes by polling: %s (cannot use %s)",
                exc.strerror or exc,
                self._directory,
            )

    def stop(self) -> None:
        sock, name, dir_fd = self._socket, self._name, self._dir_fd
        self._socket = self._name = self._dir_fd = None
        if sock is None or name is None or dir_fd is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed already
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)
