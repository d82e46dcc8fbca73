"""What happens around the app when this replica's role changes ("demote the pod").

``/leader`` answers 503 the instant the elector demotes (rule 4); the actions here follow, in
order, off the election loop so a slow webhook can never delay a renewal: the Kubernetes role
label and Event (added by the Kubernetes backend), the webhook to the app, the signal to the
app. A step down on purpose (SIGTERM, a release, a transfer) tells the app at once, and the
actions marked ``after_release`` (the Kubernetes ones) go, beside the app's, once the store
answered the release: sent beside it, they competed with it at the API server and held the
hand-off up by a few ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as signals
from pathlib import Path
from typing import Protocol

from sidecar.logs import log
from sidecar.status import Role, Transition

logger = logging.getLogger("sidecar.demotion")


class Action(Protocol):
    name: str
    # True: on a step down on purpose, run after the app's actions, once the store answered.
    after_release: bool

    async def __call__(self, transition: Transition) -> None: ...


class ActionRunner:
    """Runs every action for one transition before starting on the next, so the app sees
    ``leader`` then ``follower`` in the order they happened."""

    def __init__(self, actions: list[Action], action_timeout: float = 10.0) -> None:
        self.actions = actions
        self.action_timeout = action_timeout
        self._queue: asyncio.Queue[Transition] = asyncio.Queue()

    def submit(self, transition: Transition) -> None:
        if self.actions:
            self._queue.put_nowait(transition)

    async def run(self) -> None:
        while True:
            transition = await self._queue.get()
            try:
                await self._apply(transition)
            finally:
                self._queue.task_done()

    async def _apply(self, transition: Transition) -> None:
        settled = transition.settled
        if settled is None:
            await self._in_order(self.actions, transition)
            return
        # On purpose: the app's actions at once; the others, in their order, as soon as the
        # store answered — beside the app's, so a slow webhook does not hold them up.
        app = [action for action in self.actions if not action.after_release]
        store = [action for action in self.actions if action.after_release]

        async def after_release() -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.action_timeout):
                    await settled.wait()
            await self._in_order(store, transition)

        await asyncio.gather(self._in_order(app, transition), after_release())

    async def _in_order(self, actions: list[Action], transition: Transition) -> None:
        for action in actions:
            try:
                async with asyncio.timeout(self.action_timeout):
                    await action(transition)
            except Exception as exc:
                log(
                    logger,
                    "error",
                    "demotion action failed",
                    action=action.name,
                    role=transition.role.value,
                    reason=transition.reason,
                    error=f"{type(exc).__name__}: {exc}",
                )

    async def drain(self, timeout: float) -> bool:
        """Wait for queued transitions (e.g. the shutdown demotion) to finish."""
        try:
            async with asyncio.timeout(timeout):
                await self._queue.join()
        except TimeoutError:
            return False
        return True


class Webhook:
    """POSTs the state as JSON to the app on every transition, with retries."""

    name = "webhook"
    after_release = False

    def __init__(self, url: str, timeout: float = 2.0, retries: int = 3) -> None:
        self.url = url
        self.timeout = timeout
        self.retries = retries

    async def __call__(self, transition: Transition) -> None:
        import aiohttp

        body = {
            **transition.status.to_json(),
            "event": transition.role.value,
            "reason": transition.reason,
        }
        last_error = ""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as http:
            for attempt in range(self.retries + 1):
                try:
                    async with http.post(self.url, json=body) as response:
                        if response.status < 300:
                            return
                        last_error = f"HTTP {response.status}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                if attempt < self.retries:
                    await asyncio.sleep(min(0.1 * 2**attempt, 1.0))
        raise RuntimeError(f"{self.url} failed {self.retries + 1} times, last: {last_error}")


class SignalApp:
    """Sends a signal to the app's processes (found by name) when this replica stops leading.
    In a pod this needs ``shareProcessNamespace: true``."""

    name = "signal"
    after_release = False

    def __init__(self, process_name: str, signal_name: str = "SIGTERM", proc: Path = Path("/proc")):
        self.process_name = process_name
        self.signal = signals.Signals[signal_name]
        self.proc = proc

    async def __call__(self, transition: Transition) -> None:
        if transition.role is not Role.FOLLOWER:
            return
        pids = self.find()
        if not pids:
            raise RuntimeError(f"no process named {self.process_name!r} to signal")
        for pid in pids:
            try:
                os.kill(pid, self.signal)
            except ProcessLookupError:
                continue
            log(
                logger,
                "info",
                "signalled the app",
                pid=pid,
                signal=self.signal.name,
                process=self.process_name,
                reason=transition.reason,
            )

    def find(self) -> list[int]:
        found = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
                argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            except OSError:
                continue
            if self.process_name in (comm, os.path.basename(argv0)):
                found.append(int(entry.name))
        return found
