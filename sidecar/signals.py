"""What each signal does to the sidecar process.

| signal | effect |
|---|---|
| SIGTERM, SIGINT | the first: orderly shutdown (demote, release, exit 0); later ones: ignored |
| SIGUSR1 | one ``state`` log line: leadership, term, connections and waiters per listener |
| SIGHUP, SIGUSR2 | ignored (logged): a stray signal must not end a leader without release |

The handlers are installed with `signal.signal`, before the event loop starts and for the rest
of the process. asyncio's ``add_signal_handler`` puts the default action back when the loop
closes, so a second SIGTERM that arrived while the interpreter exited killed it with 143.
A handler only hands work to the loop; it never touches it once the loop has closed. At the
very end every one of them is set to SIG_IGN (see `Signals.ignore_all`).

Python runs signal handlers in the main thread, but the kernel may deliver a signal to any
thread (the listeners' thread, an executor's). The main thread, asleep in the event loop's
``epoll_wait``, would then not run the handler until something else woke it — seconds, for a
follower. `attach` therefore points ``signal.set_wakeup_fd`` at a socket the loop watches: every
signal wakes the main loop, which runs the handler at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import types
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUMP_SIGNALS = (signal.SIGUSR1,)
IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGUSR2)


class Signals:
    def __init__(self) -> None:
        self.stop_requested = False
        self.repeated_stops = 0  # stop signals after the first, ignored
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_stop: Callable[[], None] | None = None
        self._on_dump: Callable[[], None] | None = None
        self._on_ignored: Callable[[str], None] | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup_fd = -1

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._stop)
        for signum in DUMP_SIGNALS:
            signal.signal(signum, self._dump)
        for signum in IGNORED_SIGNALS:
            signal.signal(signum, self._ignore)

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_stop: Callable[[], None],
        on_dump: Callable[[], None],
        on_ignored: Callable[[str], None],
    ) -> None:
        """Route signals to the running loop; a stop that came before is delivered now."""
        self._loop = loop
        self._on_stop, self._on_dump, self._on_ignored = on_stop, on_dump, on_ignored
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._wakeup = (reader, writer)
        self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        loop.add_reader(reader.fileno(), self._drain_wakeup)
        if self.stop_requested:
            loop.call_soon(on_stop)

    def _drain_wakeup(self) -> None:
        """The bytes only woke the loop; the handler itself runs as Python code in this
        thread right after."""
        if self._wakeup is None:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wakeup[0].recv(4096):
                pass

    def detach(self) -> None:
        """The loop is closing: from now on signals only update the flags."""
        loop, self._loop = self._loop, None
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            if loop is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(self._wakeup[0].fileno())
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    def ignore_all(self) -> None:
        """The work is done: ignore every signal we handle until the process has exited.
        Python's finalization puts the default action back for any handler written in
        Python (SIG_IGN excepted), and joining the store's threads can take a while."""
        for signum in (*STOP_SIGNALS, *DUMP_SIGNALS, *IGNORED_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)

    def _stop(self, signum: int, frame: types.FrameType | None) -> None:
        if self.stop_requested:
            self.repeated_stops += 1
            return
        self.stop_requested = True
        self._call(self._on_stop)

    def _dump(self, signum: int, frame: types.FrameType | None) -> None:
        self._call(self._on_dump)

    def _ignore(self, signum: int, frame: types.FrameType | None) -> None:
        on_ignored = self._on_ignored
        if on_ignored is not None:
            name = signal.Signals(signum).name
            self._call(lambda: on_ignored(name))

    def _call(self, callback: Callable[[], None] | None) -> None:
        loop = self._loop
        if loop is None or callback is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(callback)
