"""Wiring: one store client, one elector per lease (a `LeaseSet`), two listeners, the demotion
actions, and an orderly exit."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.api_thread import ApiThread
from sidecar.app_check import CHECK_OUTCOMES, AppCheck, Heartbeat
from sidecar.binding import AddressError, ListenFailed
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.config import Config
from sidecar.config_error import ConfigError
from sidecar.demotion import Action, ActionRunner, SignalApp, Webhook
from sidecar.listener import Listener, open_files_shortfall
from sidecar.logs import log
from sidecar.metrics import AppMetrics, Metrics, for_config
from sidecar.options import HostPort
from sidecar.starting_api import (
    create_starting_local_app,
    create_starting_public_app,
    starting_statuses,
    store_open,
)
from sidecar.supervisor import Supervisor

if TYPE_CHECKING:
    from sidecar.backends.actions import StoreActions
    from sidecar.backends.base import LeaseStore, StoreClient
    from sidecar.status import GapAlert

# The electors, the lease set, the API at work and the store's client are imported where the
# store is opened (`Sidecar.open`), after the listeners' first answer: importing them is most
# of what a start would otherwise spend on our own code before it.

logger = logging.getLogger("sidecar")

SHUTDOWN_BUDGET = 1.5  # SIGTERM → exit within 2 s, with room for the interpreter to exit
APP_ALONE_EVENTS = 16  # Events at most when many leases are kept for an app that is down


class Sidecar:
    """Start with `start`, stop with `stop`; `wait` returns when the election task ends."""

    def __init__(
        self,
        config: Config,
        *,
        store: LeaseStore | None = None,
        client: StoreClient | None = None,
        registry: CollectorRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        scrub: Callable[[str], str] = str,
    ) -> None:
        self.config = config
        self.scrub = scrub  # removes secrets from text the API shows (store errors)
        self.registry = registry or CollectorRegistry()
        # Every background task, the listeners' change feeds included: restarted when it
        # fails, and named by /healthz while it waits to be.
        self.supervisor = Supervisor(self.registry)
        # Every lease's series exist from the first scrape, before the store is open.
        self._metrics_of = for_config(config, self.registry)
        shown = [config.lease_ref] if store is not None else map(config.ref, config.lease_names)
        self._metrics = {lease: self._metrics_of(lease) for lease in shown}
        self._clock = clock
        self._started_at = clock.wall()  # `since` of a lease while the store is not open
        self.client: StoreClient | None = None
        self.listeners: list[Listener] = []
        self.api_thread: ApiThread | None = None  # the listeners' thread (see api_thread)
        self._election: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.addresses: dict[str, HostPort] = {}
        # Leadership follows the app (`sidecar.app_check`), when a check is configured.
        self.app_check: AppCheck | None = None
        self.app_metrics: AppMetrics | None = None
        self._app_alone_listener: Callable[[str, str | None], Awaitable[None]] | None = None
        if config.app.configured:
            self.app_metrics = AppMetrics(
                self.registry,
                lambda: self.app_check is not None and self.app_check.up,
                lambda: self.leases.app_down_alone_seconds if self._opened else 0.0,
                CHECK_OUTCOMES,
                config.ref(config.candidate_group),
            )
            self.app_check = AppCheck(config.app, clock=clock, count=self.app_metrics.check)
        self.actions = ActionRunner([])
        self._opened = False
        if store is not None or client is not None:
            self._open(store, client)

    @property
    def opened(self) -> bool:
        """The store's client is built and every lease's elector made (`open`)."""
        return self._opened

    def open(self) -> None:
        """Build the store's client (importing its driver) and every lease's elector; `start`
        does it once the listeners answer. Raises `ConfigError` for what only the client can
        check (a TLS file that does not load, a driver that does not import)."""
        if not self._opened:
            from sidecar.backends import open_client

            self._open(None, open_client(self.config, self.supervisor))

    def _open(self, store: LeaseStore | None, client: StoreClient | None) -> None:
        from sidecar.elector import Elector
        from sidecar.lease_set import LeaseSet

        config, timing, clock = self.config, self.config.timing, self._clock
        made, make = self._metrics, self._metrics_of

        def metrics(shown: str) -> Metrics:
            return made.pop(shown, None) or make(shown)

        if store is not None:  # one lease over a store the caller opened (tests, embedding)
            elector = Elector(
                store,
                timing,
                config.identity,
                config.lease_ref,
                metrics=metrics(config.lease_ref),
                clock=clock,
                supervisor=self.supervisor,
            )
            self.leases = LeaseSet(
                {elector.lease: elector}, clock=clock, supervisor=self.supervisor
            )
        else:
            assert client is not None
            self.client = client
            self.leases = LeaseSet.open(
                client,
                [(name, config.ref(name)) for name in config.lease_names],
                timing,
                config.identity,
                group=config.candidate_group,
                registry_metrics=metrics,
                revision=config.revision,
                priority=config.priority,
                stand_back=config.stand_back,
                clock=clock,
                supervisor=self.supervisor,
            )
        store_actions = self._store_actions()
        if self.app_check is not None and self.app_metrics is not None:
            self.leases.use_app(self.app_check, self.app_metrics.handover)
            self._app_alone_listener = store_actions.on_app_alone
            if self._app_alone_listener is not None:
                self.leases.on_app_alone = self._on_app_alone
        self.elector = self.leases.primary  # the first lease: `GET /leader` when it is the only
        self.store = self.elector.store
        self.metrics = self.elector.metrics
        self._gap_listener = store_actions.on_gap_alert
        self.actions = ActionRunner([*store_actions.on_transition, *self._app_actions()])
        submit, on_gap_alert = self.actions.submit, self._on_gap_alert  # one each, shared
        for elector in self.leases.electors.values():
            elector.on_transition(submit)
            if self._gap_listener is not None:
                elector.on_gap_alert(on_gap_alert)
        self._opened = True

    def _store_actions(self) -> StoreActions:
        """What only the chosen store can do around a transition (on Kubernetes: relabel pods
        and record Events)."""
        from sidecar.backends.actions import NO_ACTIONS, ActionsContext

        build = self.config.backend.actions
        if build is None:
            return NO_ACTIONS
        stores = {shown: elector.store for shown, elector in self.leases.electors.items()}
        return build(
            ActionsContext(self.config, self.leases.primary.store, stores, self._store_refusing)
        )

    def _on_app_alone(self, leases: list[str], why: str | None) -> None:
        assert self._app_alone_listener is not None
        for lease in leases[:APP_ALONE_EVENTS]:  # one Event per lease, a bounded number
            self._spawn(self._app_alone_listener(lease, why), "app-alone-event")

    def _store_refusing(self) -> bool:
        """The sidecar's one store probe says the store refuses (`sidecar.probe`): what can
        wait does not retry then."""
        probe = self.leases.probe
        return probe is not None and probe.refusing

    def _app_actions(self) -> list[Action]:
        """What every store does: tell the app by webhook, then by signal."""
        actions: list[Action] = []
        if self.config.webhook_url:
            actions.append(
                Webhook(
                    self.config.webhook_url,
                    self.config.webhook_timeout,
                    self.config.webhook_retries,
                )
            )
        if self.config.signal_process:
            actions.append(SignalApp(self.config.signal_process, self.config.signal))
        return actions

    def _on_gap_alert(self, alert: GapAlert) -> None:
        assert self._gap_listener is not None
        self._spawn(self._gap_listener(alert), "gap-alert")

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        async def run() -> None:
            await work

        task = asyncio.create_task(run(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _supervise(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        task = self.supervisor.spawn(name, work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def state(self) -> dict[str, Any]:
        """What SIGUSR1 logs: leadership as ``GET /leader`` answers it, and per listener how
        much of each limit is in use and how much was refused."""
        if not self._opened:
            return {
                "identity": self.config.identity,
                "starting": True,
                "listeners": {listener.name: listener.usage() for listener in self.listeners},
            }
        if len(self.leases.electors) > 1:
            leadership: dict[str, Any] = {
                "identity": self.leases.identity,
                "leases": len(self.leases.electors),
                "held": self.leases.held(),
            }
        else:
            leadership = {**self.elector.status().to_json(), "role": self.elector.role.value}
        return {
            **leadership,
            "last_error": self.scrub(self.leases.last_error or "") or None,
            "listeners": {listener.name: listener.usage() for listener in self.listeners},
        }

    def election_alive(self) -> bool:
        return self._election is not None and not self._election.done()

    def health(self) -> dict[str, str]:
        """What ``/healthz`` reports as down: the election task if it ended, and every
        background task waiting to be restarted (`Supervisor.down`), each with its error."""
        down = self.supervisor.down()
        if not self.election_alive():
            down = {"election": "the election task has stopped", **down}
        return down

    async def start(self) -> None:
        """Listen, then open the store (unless the caller opened it): the listeners answer
        while the store's driver is imported and its client built, then the election starts."""
        limits = self.config.limits
        shortfall = open_files_shortfall(limits)
        if shortfall is not None:
            log(
                logger,
                "warning",
                "the open-file limit is below what the connection limits allow; "
                "lower --max-connections or raise the limit (ulimit -n)",
                max_connections=limits.max_connections,
                missing_files=shortfall,
            )
        self.api_thread = ApiThread()
        if self._opened:
            self._log_starting()
            await self._listen(self._apps())
            self._log_listening()
        else:
            await self._listen(self._starting_apps())
            self.open()
            for listener, app in zip(self.listeners, self._apps(), strict=True):
                starting = listener.runner.app
                await self.api_thread.run(listener.serve(app))
                await self.api_thread.run(store_open(starting))
            # Logged once the API at work answers: a setting only the store's client checks
            # stops the sidecar with its one line, as one the configuration checks does.
            self._log_starting()
            self._log_listening()
        await self.leases.prime(self.config.timing.request_timeout)
        self._election = asyncio.create_task(self.leases.run(), name="election")
        self._supervise("demotion-actions", self.actions.run)
        # Everything start-up made (the imported modules are most of it) moves out of the
        # collector's reach: a full collection then walks only what was made since. Walking it
        # all took 20-50 ms, which landed on hand-offs and renewals (docs/benchmarks.md).
        gc.freeze()

    def _log_starting(self) -> None:
        log(
            logger,
            "info",
            "starting",
            store=self.client.description if self.client else self.store.description,
            lease=self.config.lease_ref,
            leases=len(self.leases.electors),
            group=self.config.candidate_group if self.client else None,
            identity=self.config.identity,
            lease_duration=self.config.timing.lease_duration,
            renew_interval=self.config.timing.renew_interval,
            retry_period=self.config.timing.retry_period,
            request_timeout=self.config.timing.request_timeout,
        )

    def _starting_apps(self) -> tuple[web.Application, web.Application]:
        """The listeners' apps until the store is open (`sidecar.starting_api`)."""
        config = self.config
        statuses = starting_statuses(
            config.identity,
            [config.ref(name) for name in config.lease_names],
            config.timing.lease_duration,
            self._started_at,
        )
        return (
            create_starting_local_app(statuses, config.limits, self._heartbeat()),
            create_starting_public_app(
                statuses, self.registry, self.health, config.limits, self.scrub
            ),
        )

    def _heartbeat(self) -> Heartbeat | None:
        """What every call of the app to the localhost API stamps (``--app-heartbeat``)."""
        if self.app_check is None or self.config.app.heartbeat is None:
            return None
        return self.app_check.heartbeat

    def _apps(self) -> tuple[web.Application, web.Application]:
        from sidecar.api import create_local_app, create_public_app

        limits = self.config.limits
        local = create_local_app(
            self.leases,
            limits,
            self.scrub,
            self.supervisor,
            heartbeat=self._heartbeat(),
            pod_name=self.config.pod_name,
        )
        public = create_public_app(
            self.leases, self.registry, self.health, limits, self.scrub, self.supervisor
        )
        return local, public

    async def _listen(self, apps: tuple[web.Application, web.Application]) -> None:
        assert self.api_thread is not None
        limits = self.config.limits
        for name, flag, app, where in (
            ("local", "--listen", apps[0], self.config.listen),
            ("public", "--public-listen", apps[1], self.config.public_listen),
        ):
            listener = Listener(name, app, where, limits)
            self.listeners.append(listener)
            try:
                self.addresses[name] = await self.api_thread.run(listener.start())
            except AddressError as exc:
                raise ConfigError(
                    flag, where, f"must name an address of this host: {exc}"
                ) from None
            except OSError as exc:  # a port in use: one line naming the flag (cli)
                raise ListenFailed(flag, where, exc) from None

    def _log_listening(self) -> None:
        for listener in self.listeners:
            assert listener.bound is not None
            for address, reason in listener.bound.skipped:
                log(
                    logger,
                    "warning",
                    "not listening on an address this host does not have",
                    listener=listener.name,
                    address=address,
                    error=reason,
                )
            log(
                logger,
                "info",
                "listening",
                listener=listener.name,
                address=str(self.addresses[listener.name]),
                addresses=listener.bound.addresses(),
            )

    async def wait(self) -> None:
        assert self._election is not None
        await asyncio.wait([self._election])

    async def stop(self) -> None:
        """Demote, release, let the demotion actions finish, close — within the budget. With
        an app check, a leader first drains: 503 at once, the lease kept until its app has
        stopped (at most ``--drain-timeout``), so that no new leader starts beside it."""
        loop = asyncio.get_running_loop()
        election = self._election
        if self._opened:  # (else nothing started: the listeners close without a word)
            log(logger, "info", "stopping", lease=self.config.lease_ref)
        drained = await self._drain(election)
        deadline = loop.time() + SHUTDOWN_BUDGET
        released = await self._release(election, deadline) if self._opened else False
        if election is not None:
            # Cancel until it is done, within a bounded time: a cancel that lands as a store
            # request's own timeout is swallowed once, and `stop()` above ends the loop anyway.
            for _ in range(5):
                if election.done():
                    break
                election.cancel()
                await asyncio.wait({election}, timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                if election.done():
                    await election
        await self.actions.drain(max(0.05, deadline - loop.time() - 0.3))
        background = list(self._background)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for listener in self.listeners:
            if self.api_thread is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self.api_thread.run(listener.stop()), max(0.05, deadline - loop.time())
                    )
        if self.api_thread is not None:
            self.api_thread.close()
        for elector in self.leases.electors.values() if self._opened else ():
            with contextlib.suppress(Exception):
                await elector.store.close()
        if self.client is not None:
            await self.client.close()
        if drained and self.app_metrics is not None:
            for _ in range(drained):
                self.app_metrics.handover("drain")
        if self._opened:
            log(logger, "info", "stopped", lease=self.config.lease_ref, released=released)

    async def _release(self, election: asyncio.Task[None] | None, deadline: float) -> bool:
        """The first steps of `stop`: no new step, then every lease held released."""
        loop = asyncio.get_running_loop()
        self.leases.stop()  # no new step starts; a step in flight finishes first (its lock)
        if election is not None and election.done() and not election.cancelled():
            crashed = election.exception()
            if crashed:
                log(logger, "error", "the election task failed", error=repr(crashed))
        # Hand over first: the successor waits for exactly this, and cancelling the election
        # tasks first (their watches, the candidates' beat) cost the hand-off milliseconds.
        return await self.leases.shutdown(
            "shutdown",
            max(0.1, min(self.config.timing.request_timeout, deadline - loop.time() - 0.4)),
        )

    async def _drain(self, election: asyncio.Task[None] | None) -> int:
        """The drain of `stop`: how many leases were held when it ended (0: no drain)."""
        if (
            self.app_check is None
            or self.config.drain_timeout <= 0
            or election is None
            or election.done()
        ):
            return 0
        outcome = await self.leases.drain(self.config.drain_timeout)
        if outcome == "none":
            return 0
        assert self.app_metrics is not None
        self.app_metrics.drain(outcome)
        return len(self.leases.held())
