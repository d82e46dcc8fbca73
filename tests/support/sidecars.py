"""Real ``leader-sidecar`` processes and an observer that polls them all.

`SidecarProcess.start` runs ``python -m sidecar`` with both listeners on port 0 and reads the
bound ports from its JSON log. `LeaderObserver` polls every sidecar's ``/leader`` every 10 ms
for the whole test and can prove that two replicas claimed leadership at the same instant:
each 200 says since when that replica has led (``since``, wall clock, same host), so two
200s from different replicas whose reigns both began before both requests were sent mean both
led at the later of the two ``since`` moments.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]


class SidecarProcess:
    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc = proc
        self.name = name
        self.logs: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.local = ""
        self.public = ""
        self.identity = ""

    @classmethod
    def start(
        cls,
        name: str,
        store: str,
        *,
        lease_duration: str = "1s",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        ready_timeout: float = 15.0,
        prefix: Sequence[str] = (),
        max_open_files: int | None = None,
        root: Path = REPO,
    ) -> SidecarProcess:
        """``root``: the checkout whose ``sidecar`` package runs (``python -m`` imports from
        the working directory first), e.g. an older commit's worktree for a benchmark."""
        command = [
            *prefix,  # e.g. unshare --time …: runs the sidecar inside another command
            sys.executable,
            "-m",
            "sidecar",
            "--store",
            store,
            "--identity",
            name,
            "--lease-duration",
            lease_duration,
            "--listen",
            "127.0.0.1:0",
            "--public-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            *args,
        ]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        environment.update(env or {})
        proc = subprocess.Popen(
            command,
            cwd=root,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=None if max_open_files is None else _limit_open_files(max_open_files),
        )
        sidecar = cls(proc, name)
        try:
            sidecar._wait_listening(ready_timeout)
        except BaseException:
            sidecar.stop()  # never leave a half-started process behind
            raise
        return sidecar

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.raw.append(line.rstrip("\n"))
                with contextlib.suppress(ValueError):
                    self.logs.append(json.loads(line))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_log(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for entry in self.logs:
                    if predicate(entry):
                        return entry
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"{self.name}: log line not seen; last lines:\n" + "\n".join(self.raw[-20:])
                    )
                self._changed.wait(remaining)

    def _wait_listening(self, timeout: float) -> None:
        starting = self.wait_log(lambda e: e.get("msg") == "starting", timeout)
        self.identity = starting["identity"]
        for listener in ("local", "public"):
            entry = self.wait_log(
                lambda e, ln=listener: e.get("msg") == "listening" and e.get("listener") == ln,
                timeout,
            )
            setattr(self, listener, entry["address"])

    @property
    def leader_url(self) -> str:
        return f"http://{self.local}/leader"

    @property
    def public_leader_url(self) -> str:
        return f"http://{self.public}/leader"

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(5)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Cleanup: whatever state it is in, make it gone."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)


def _limit_open_files(limit: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


@contextlib.contextmanager
def sidecars(names: Sequence[str], store: str, **kwargs: Any) -> Any:
    started: list[SidecarProcess] = []
    try:
        for name in names:
            started.append(SidecarProcess.start(name, store, **kwargs))
        yield started
    finally:
        for sidecar in started:
            sidecar.stop()


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    sent: float  # wall clock (time.time()) when the request was sent
    received: float
    status: int | None  # None: no answer (refused, reset)
    body: dict[str, Any] | None

    @property
    def leader(self) -> bool:
        return self.status == 200

    @property
    def term(self) -> int | None:
        return self.body["term"] if self.body else None

    @property
    def identity(self) -> str | None:
        return self.body["identity"] if self.body else None

    @property
    def since(self) -> float:
        assert self.body is not None
        assert self.body["since"]
        return datetime.fromisoformat(self.body["since"].replace("Z", "+00:00")).timestamp()


class LeaderObserver:
    """Polls every sidecar's /leader every ``interval`` seconds, one request in flight per
    sidecar (a paused sidecar's request waits for it to resume: its answer is then the first
    one it gives after resuming)."""

    def __init__(
        self, sidecars: Sequence[SidecarProcess], interval: float = 0.01, *, public: bool = False
    ) -> None:
        """``public``: ask the public listener, so that the observer's calls are not the app's
        heartbeat (``--app-heartbeat`` counts calls to the localhost API)."""
        self.public = public
        self.sidecars = list(sidecars)
        self.interval = interval
        self.samples: list[Sample] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._new_sample = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LeaderObserver:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        for sidecar in self.sidecars:
            self.watch(sidecar)
        return self

    def watch(self, sidecar: SidecarProcess) -> None:
        """Start polling a sidecar (also one started after the observer)."""
        if sidecar not in self.sidecars:
            self.sidecars.append(sidecar)
        self._tasks.append(asyncio.create_task(self._poll(sidecar)))

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._tasks)
        assert self._session is not None
        await self._session.close()

    async def _poll(self, sidecar: SidecarProcess) -> None:
        assert self._session is not None
        while True:
            sent = time.time()
            status: int | None = None
            body: dict[str, Any] | None = None
            try:
                url = sidecar.public_leader_url if self.public else sidecar.leader_url
                async with self._session.get(url) as response:
                    status = response.status
                    body = await response.json()
            except (TimeoutError, aiohttp.ClientError, ValueError):
                if sidecar.proc.poll() is not None:
                    self._record(Sample(sidecar.name, sent, time.time(), None, None))
                    return  # exited: nothing more to observe
            self._record(Sample(sidecar.name, sent, time.time(), status, body))
            await asyncio.sleep(self.interval)

    def _record(self, sample: Sample) -> None:
        self.samples.append(sample)
        self._new_sample.set()
        self._new_sample = asyncio.Event()

    async def wait_for(self, predicate: Callable[[Sample], bool], timeout: float) -> Sample:
        """The first sample (from now on or already seen after ``not_before``) matching."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for sample in self.samples[checked:]:
                if predicate(sample):
                    return sample
            checked = len(self.samples)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching /leader answer within {timeout}s")
            event = self._new_sample
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def leader(self, timeout: float = 10.0, after: float = 0.0) -> Sample:
        """The first 200 answered for a request sent after ``after`` (wall clock)."""
        return await self.wait_for(lambda s: s.leader and s.sent >= after, timeout)

    async def all_seen(self, term: int, names: Sequence[str], timeout: float = 10.0) -> None:
        """Wait until each sidecar in ``names`` has answered with ``term`` or a higher one,
        leading or not: each has seen it. A replica that never saw a term cannot know one was
        lost (docs/design.md, rule 8's limit), so a test of what replicas do after a loss lets
        them all see the terms first; a slow start would otherwise race the fault."""
        for name in names:
            await self.wait_for(
                lambda s, name=name: s.name == name and (s.term or 0) >= term, timeout
            )

    def two_leaders_at_once(self) -> list[tuple[Sample, Sample]]:
        """Pairs of 200s from different identities proving both led at one instant."""
        latest: dict[tuple[str, float], Sample] = {}  # one reign = identity + since
        for sample in self.samples:
            if sample.leader:
                assert sample.identity is not None
                key = (sample.identity, sample.since)
                if key not in latest or sample.sent > latest[key].sent:
                    latest[key] = sample
        reigns = list(latest.items())
        overlaps = []
        for i, ((id_a, since_a), a) in enumerate(reigns):
            for (id_b, since_b), b in reigns[i + 1 :]:
                # Both were leader from their `since` until they answered; the later start
                # precedes both requests (2 ms for the millisecond rounding of `since`).
                if id_a != id_b and max(since_a, since_b) + 0.002 < min(a.sent, b.sent):
                    overlaps.append((a, b))
        return overlaps

    def assert_never_two_leaders(self) -> None:
        overlaps = self.two_leaders_at_once()
        assert not overlaps, f"two leaders at once: {overlaps[:3]}"
        assert any(s.leader for s in self.samples), "no leader was ever observed"

    def count(self) -> int:
        return len(self.samples)


async def cancel_and_wait(tasks: Sequence[asyncio.Task[Any]], rounds: int = 20) -> None:
    """Cancel until done. A cancellation that lands as a client timeout fires is turned into
    a TimeoutError by aiohttp (and redis.asyncio), which a polling loop catches and carries
    on: one cancel() is then lost and a plain gather() waits forever (seen in the chaos
    suite). Each round waits at most 0.5 s."""
    pending = {task for task in tasks if not task.done()}
    for _round in range(rounds):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=0.5)
    if pending:
        raise AssertionError(f"{len(pending)} task(s) did not stop: {pending}")
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def observing(
    sidecars: Sequence[SidecarProcess], *, public: bool = False
) -> AsyncIterator[LeaderObserver]:
    async with LeaderObserver(sidecars, public=public) as observer:
        yield observer
        observer.assert_never_two_leaders()


def by_name(procs: Sequence[SidecarProcess], name: str) -> SidecarProcess:
    return next(proc for proc in procs if proc.name == name)


@dataclasses.dataclass(frozen=True)
class Handover:
    """The leader was signalled at ``began`` (wall clock); ``successor`` is the first 200
    from another replica for a request sent after that."""

    before: Sample
    successor: Sample
    began: float
    leader: SidecarProcess

    @property
    def seconds(self) -> float:
        """From the signal to the moment the successor's reign began."""
        return self.successor.since - self.began


async def signal_leader(
    observer: LeaderObserver, procs: Sequence[SidecarProcess], signum: int, within: float
) -> Handover:
    """Signal the current leader (SIGKILL: crash; SIGTERM: shutdown with release) and wait
    up to ``within`` seconds for another replica to lead under a higher term."""
    before = await observer.leader(after=time.time())  # now: not the run's first leader
    leader = by_name(procs, before.name)
    began = time.time()
    leader.signal(signum)
    if signum == signal.SIGKILL:
        leader.proc.wait(5)
    successor = await observer.wait_for(
        lambda s: s.leader and s.name != before.name and s.sent >= began, timeout=within
    )
    assert successor.term is not None
    assert before.term is not None
    assert successor.term > before.term
    return Handover(before, successor, began, leader)
