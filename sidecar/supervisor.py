"""Background tasks that come back: every long-running task of the sidecar runs under one
`Supervisor`.

A task that raises ends silently in asyncio: its exception waits in the task object until
the object is collected ("Task exception was never retrieved"), and nothing else notices.
Issue 25 found the candidate heartbeat dead for good in every sidecar after one malformed row
(balancing stopped, ``/readyz`` said 503 for ever, ``/healthz`` said 200), and the SQLite
watch poller dead after one unparsable timestamp. Under a supervisor a task that fails:

* is logged once, with its error and the end of its traceback (a task that fails again and
  again logs at most one line per 10 s per task name, with ``suppressed=N``);
* is counted in ``leader_sidecar_task_failures_total{task}``;
* is restarted after a jittered back-off (client-go's: 0.8 s doubling to 30 s, back to the
  start once the task ran two minutes without failing);
* is *down* while it waits: ``/healthz`` answers 503 naming it. A task that fails once is
  down for under a second; one that fails at every start is down nearly all the time, so the
  kubelet's liveness probe restarts a sidecar that cannot recover, and only that one.

A task that returns normally is done (a hub with no watches left, a stream a store cannot
follow); cancelling it stops it at once, back-off included.

Every store client takes a supervisor for the tasks it runs itself (a poller, a pub/sub hub,
a shared watch): ``supervisor.spawn("sqlite-watch", self._poll)``. One made without a
registry (tests, ``leader-sidecar status``) logs and restarts but counts nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter

from sidecar.logs import Throttle, log
from sidecar.redact import printable

logger = logging.getLogger("sidecar.tasks")

BACKOFF = (0.8, 30.0)  # first and longest wait before a restart (client-go's reflector)
HEALTHY_AFTER = 120.0  # a task that ran this long without failing starts its back-off anew
TRACEBACK_FRAMES = 8  # the innermost frames of a failure's traceback, in its log line
ERROR_CHARS = 500  # a failure's message in the log line and in /healthz, at most


class Supervisor:
    """Runs background tasks, restarts those that fail, and says which are down. Thread
    safe: the listeners' thread runs its change feeds under the same supervisor as the
    election's loop runs its tasks (see `sidecar.api_thread`)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        backoff: tuple[float, float] = BACKOFF,
        healthy_after: float = HEALTHY_AFTER,
        rng: random.Random | None = None,
    ) -> None:
        self.backoff = backoff
        self.healthy_after = healthy_after
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._down: dict[str, int] = {}  # task name -> instances waiting to be restarted
        self._last_error: dict[str, str] = {}  # task name -> its last failure, for /healthz
        self._throttles: dict[str, Throttle] = {}
        self.failures: dict[str, int] = {}  # task name -> failures so far (also unregistered)
        self._counter: Counter | None = None
        if registry is not None:
            self._counter = Counter(
                "leader_sidecar_task_failures",
                "Background tasks that failed and were restarted, by task",
                ["task"],
                registry=registry,
            )

    def spawn(self, name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        """`run` as a task of the running loop, named ``name``."""
        return asyncio.create_task(self.run(name, work), name=name)

    async def run(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        """Await ``work()`` until it returns; each time it raises, log, count, wait the
        back-off and call it again. Cancelling this cancels ``work`` and the wait."""
        with self._lock:
            self.failures.setdefault(name, 0)
        if self._counter is not None:
            self._counter.labels(name)  # a zero from the start, so increase() sees the first
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            try:
                await work()
                return
            except Exception as exc:
                if loop.time() - started >= self.healthy_after:
                    failures = 0
                failures += 1
                delay = self._delay(failures)
                self._failed(name, exc, failures, delay)
            with self._marked_down(name):
                await asyncio.sleep(delay)

    def down(self) -> dict[str, str]:
        """Tasks waiting to be restarted now, each with its last error."""
        with self._lock:
            return {name: self._last_error.get(name, "") for name, n in self._down.items() if n}

    # -- inner workings -----------------------------------------------------------------

    def _delay(self, failures: int) -> float:
        first, longest = self.backoff
        return min(longest, first * 2.0 ** min(failures - 1, 30)) * self._rng.uniform(0.5, 1.0)

    def _failed(self, name: str, exc: Exception, failures: int, delay: float) -> None:
        error = printable(f"{type(exc).__name__}: {exc}")[:ERROR_CHARS]
        with self._lock:
            self.failures[name] = self.failures.get(name, 0) + 1
            self._last_error[name] = error
            throttle = self._throttles.setdefault(name, Throttle())
        if self._counter is not None:
            self._counter.labels(name).inc()
        if throttle.allow():
            frames = traceback.format_exception(exc, limit=-TRACEBACK_FRAMES)
            log(
                logger,
                "error",
                "a background task failed; restarting it",
                task=name,
                error=error,
                failures_in_a_row=failures,
                restart_in_seconds=round(delay, 3),
                traceback="".join(frames)[-4000:],
                suppressed=throttle.take_suppressed(),
            )

    @contextlib.contextmanager
    def _marked_down(self, name: str) -> Iterator[None]:
        """One instance of ``name`` counts as down for the length of the block."""
        with self._lock:
            self._down[name] = self._down.get(name, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._down[name] -= 1
