"""N replica slots around one store: in each, a real sidecar process (replaced when the
schedule kills or stops it), its wall-clock shift, and the fenced writer beside it; one
`LeaderObserver` polls every process's ``/leader`` for the whole run.

Sharded (``shards`` > 0): every sidecar runs ``--lease jobs --shards N``; one `LeasesObserver`
polls every process's ``/leases`` and keeps one sample per lease per answer, and beside each
slot a `ShardWriter` writes for every shard its replica leads.

With apps (the app-fault round): every slot has an `App` too, started before its sidecar, and
every sidecar checks it (``--app-health-url``); the fenced writer of a slot writes only while
its app is up (`App.may_write`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.chaos.apps import App
from tests.chaos.clock import ClockShift
from tests.chaos.fence import FencedWriter, ShardWriter
from tests.chaos.stores import StoreHarness
from tests.support.sidecars import LeaderObserver, Sample, SidecarProcess

OBSERVER_INTERVAL = 0.01  # seconds between two polls of one sidecar
SHARDED_OBSERVER_INTERVAL = 0.02  # one /leases answer carries every shard
START_TIMEOUT = 30.0  # one sidecar's start-up, on a busy shared machine
SHARD_LEASE = "jobs"  # --lease jobs --shards N: leases jobs-0 … jobs-{N-1}


def lease_of(sample: Sample) -> str | None:
    """The lease a `LeasesObserver` sample is about (None: no answer, about every lease)."""
    return sample.body.get("lease") if sample.body else None


def leases_url(proc: SidecarProcess) -> str:
    return f"http://{proc.local}/leases"


class LeasesObserver(LeaderObserver):
    """`LeaderObserver` over ``GET /leases``: each answer becomes one sample per lease, shaped
    as that lease's ``GET /leader/{lease}`` answer would be (200 leading, else 503, the
    lease's own JSON), so every judgment reads them as it reads ``/leader`` samples."""

    async def _poll(self, sidecar: SidecarProcess) -> None:
        assert self._session is not None
        while True:
            sent = time.time()
            body: dict[str, Any] | None = None
            try:
                async with self._session.get(leases_url(sidecar)) as response:
                    body = await response.json()
            except (TimeoutError, aiohttp.ClientError, ValueError):
                if sidecar.proc.poll() is not None:
                    self._record(Sample(sidecar.name, sent, time.time(), None, None))
                    return  # exited: nothing more to observe
            received = time.time()
            if body is None or "leases" not in body:
                self._record(Sample(sidecar.name, sent, received, None, None))
            else:
                for entry in body["leases"]:
                    status = 200 if entry["leader"] else 503
                    self.samples.append(Sample(sidecar.name, sent, received, status, entry))
                self._record_done()
            await asyncio.sleep(self.interval)

    def _record_done(self) -> None:
        self._new_sample.set()
        self._new_sample = asyncio.Event()


@dataclasses.dataclass
class Slot:
    name: str
    clock: ClockShift
    procs: list[SidecarProcess] = dataclasses.field(default_factory=list)
    # Processes the schedule ended on purpose (SIGKILL, SIGTERM): their exit is no failure.
    ended_on_purpose: set[int] = dataclasses.field(default_factory=set)

    @property
    def proc(self) -> SidecarProcess:
        return self.procs[-1]

    def url(self) -> str:
        return self.proc.leader_url


class Cluster:
    def __init__(
        self,
        store: StoreHarness,
        size: int,
        lease: float,
        directory: Path,
        shim: Path,
        shards: int = 0,
        apps: bool = False,
    ) -> None:
        self.store = store
        self.lease = lease
        self.shards = shards
        if shards:
            store.lease = SHARD_LEASE
        self.directory = directory
        self.shim = shim
        self.slots = [
            Slot(f"s{index}", ClockShift(shim, directory / f"clock-s{index}"))
            for index in range(size)
        ]
        self.observer = (
            LeasesObserver([], interval=SHARDED_OBSERVER_INTERVAL)
            if shards
            else LeaderObserver([], interval=OBSERVER_INTERVAL)
        )
        self.apps = {slot.name: App(slot.name, directory) for slot in self.slots} if apps else {}
        self.writers: list[FencedWriter | ShardWriter] = []
        self._session: aiohttp.ClientSession | None = None
        self._starting = asyncio.Semaphore(2)

    async def start(self) -> None:
        await self.store.start(self.directory, self.shim, [slot.name for slot in self.slots])
        await self.observer.__aenter__()
        for app in self.apps.values():
            await app.start()  # up before its sidecar, as an app in a pod usually is
        # Start the replicas together, as a rollout does, but no more at once than there are
        # cores here: five interpreters importing the Kubernetes client at once on a shared
        # two-core machine once took longer than the start-up bound. Every launch finishes
        # (or fails) before this returns, so none is left running unaccounted for.
        results = await asyncio.gather(
            *(self._launch_limited(slot) for slot in self.slots), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=5)
        )
        for slot in self.slots:
            writer = (
                ShardWriter(slot.name, lambda slot=slot: leases_url(slot.proc), self.store.fence)
                if self.shards
                else FencedWriter(
                    slot.name,
                    slot.url,
                    self.store.fence,
                    gate=self.apps[slot.name].may_write if self.apps else None,
                )
            )
            writer.start(self._session)
            self.writers.append(writer)

    async def _launch_limited(self, slot: Slot) -> SidecarProcess:
        async with self._starting:
            return await self.launch(slot)

    async def launch(self, slot: Slot) -> SidecarProcess:
        """A new sidecar process in ``slot`` (a new identity), watched from now on."""
        store, args = self.store.sidecar_store(slot.name)
        args = [*args, "--lease", self.store.lease]
        if self.shards:
            args += ["--shards", str(self.shards)]
        if self.apps:
            args += self.apps[slot.name].sidecar_args()
        for attempt in (1, 2):  # a start that outlasts the bound on a loaded machine: once more
            try:
                proc = await asyncio.to_thread(
                    SidecarProcess.start,
                    slot.name,
                    store,
                    lease_duration=f"{self.lease:g}s",
                    args=args,
                    env=slot.clock.env,
                    ready_timeout=START_TIMEOUT,
                )
                break
            except AssertionError as exc:
                if attempt == 2:
                    raise
                print(f"{slot.name}: a sidecar did not start, trying again: {exc}", flush=True)
        slot.procs.append(proc)
        self.observer.watch(proc)
        return proc

    def slot_of(self, name: str) -> Slot:
        return next(slot for slot in self.slots if slot.name == name)

    def slot_by_identity(self, identity: str) -> Slot | None:
        for slot in self.slots:
            if any(proc.identity == identity for proc in slot.procs):
                return slot
        return None

    async def leader_now(self, timeout: float) -> Sample | None:
        """A 200 for a request sent from now on (None when nobody leads within ``timeout``)."""
        with contextlib.suppress(AssertionError):
            return await self.observer.leader(timeout=timeout, after=time.time())
        return None

    def shard_names(self) -> list[str]:
        """The leases as the API names them (``namespace/name`` on Kubernetes), by shard."""
        names: set[str] = set()
        for sample in reversed(self.observer.samples):
            lease = lease_of(sample)
            if lease is not None:
                names.add(lease)
            if len(names) == self.shards:
                break
        return sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))

    def all_processes(self) -> list[tuple[Slot, SidecarProcess]]:
        return [(slot, proc) for slot in self.slots for proc in slot.procs]

    async def stop(self) -> None:
        for writer in self.writers:
            await writer.stop()
        if self._session is not None:
            await self._session.close()
        await self.observer.__aexit__(None, None, None)
        for _slot, proc in self.all_processes():
            await asyncio.to_thread(proc.stop)
        for app in self.apps.values():
            await asyncio.to_thread(app.stop)
        await self.store.stop()
        self.keep_logs()

    def keep_logs(self) -> None:
        """Every process's log, one file per identity under ``logs/`` of the run's directory
        (pytest keeps the last three runs' directories): what a failure is analysed from."""
        logs = self.directory / "logs"
        logs.mkdir(exist_ok=True)
        for _slot, proc in self.all_processes():
            (logs / f"{proc.identity or proc.name}.log").write_text("\n".join(proc.raw) + "\n")
