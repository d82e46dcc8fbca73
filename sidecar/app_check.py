"""Is the app beside the sidecar up? Leadership follows the app (docs/design.md, "Leadership
follows the app"): a sidecar whose app is down does not campaign, and a leader whose app goes
down hands the lease to a replica whose app is up.

Two ways to know, either or both (both: up only while both say so):

* An HTTP GET on the pod's own address (``--app-health-url``), judged as a Kubernetes probe
  judges it: ``--app-health-failures`` failures in a row turn an up app down,
  ``--app-health-successes`` successes in a row turn a down one up, one try every
  ``--app-health-period``, each within ``--app-health-timeout``. 2xx is a success; anything
  else, a redirect included (never followed), is a failure. The body is never read: a huge
  answer costs nothing, a slow one at most the timeout.
* A heartbeat (``--app-heartbeat DURATION``): the app is up while it has called the localhost
  API within DURATION, or holds a long-poll or an event stream open there. The polling an app
  already does is the heartbeat.

Like a readiness probe, an app is *down* until shown up: a sidecar that starts beside an app
still warming up waits for it. Liveness only: this never grants a lease; it decides whether
this replica tries for one, and when a leader hands its lease on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable, Mapping

from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import Throttle, log

logger = logging.getLogger("sidecar.app")

# Each outcome of one health check, for `leader_sidecar_app_checks_total{outcome}`.
CHECK_OUTCOMES = ("up", "down", "timeout", "refused", "redirect")


@dataclasses.dataclass(frozen=True)
class AppCheckSettings:
    """The flags of the app check (`sidecar.config`); None fields: that way is not used."""

    health_url: str | None = None
    period: float = 1.0
    timeout: float = 1.0
    failures: int = 3
    successes: int = 1
    heartbeat: float | None = None

    @property
    def configured(self) -> bool:
        return self.health_url is not None or self.heartbeat is not None

    @property
    def down_within(self) -> float:
        """How long after the app stops the check says so (at most): the drain's and the
        hand-over's reaction time, for logs and docs."""
        probe = self.failures * self.period + self.timeout if self.health_url is not None else 0.0
        return max(probe, self.heartbeat or 0.0)


NO_APP_CHECK = AppCheckSettings()


def pod_local_hosts(environ: Mapping[str, str] | None = None) -> set[str]:
    """The addresses a health URL may name besides loopback: the pod's own (``POD_IP``, which
    the chart sets from the downward API, and what this host's name resolves to)."""
    environ = os.environ if environ is None else environ
    hosts: set[str] = set()
    for value in (environ.get("POD_IP", ""), *environ.get("POD_IPS", "").split(",")):
        if value.strip():
            hosts.add(value.strip())
    with contextlib.suppress(OSError):
        hosts.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return hosts


def parse_health_url(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``--app-health-url``: http(s) to loopback or this pod's own address only. A name other
    than ``localhost`` is refused: DNS could send the check (and the decision to lead) to
    another pod."""
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an http:// URL of the app's health endpoint, e.g. "
                         "http://127.0.0.1:8080/healthz")  # fmt: skip
    try:
        parsed.port  # noqa: B018  (raises on a port that is not one)
    except ValueError:
        raise ValueError("has a port that is not a number from 0 to 65535") from None
    if parsed.username or parsed.password:
        raise ValueError("must not carry credentials; the check sends none")
    host = parsed.hostname
    if host == "localhost":
        return text
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            "must name the pod's own address as a number: 127.0.0.1, [::1], localhost or "
            "$POD_IP (a host name could resolve to another pod)"
        ) from None
    if address.is_loopback or str(address) in pod_local_hosts(environ):
        return text
    raise ValueError(
        "must name this pod's own address (127.0.0.1, [::1], localhost or $POD_IP): the "
        "sidecar leads only for the app beside it"
    )


class Heartbeat:
    """The app's calls to the localhost API, stamped by the listeners' thread and read by the
    election's: one float and one int, each written in one step (no lock needed)."""

    def __init__(self, within: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.within = within  # the app is up while it called within this long
        self._clock = clock
        self.last_call = float("-inf")
        self.open = 0  # long-polls and event streams held open now
        self._wake: Callable[[], None] = lambda: None

    def on_call(self, wake: Callable[[], None]) -> None:
        """``wake`` is called (on the listeners' thread) at a call that ends a quiet spell:
        the app is back, and the check should say so now rather than at its next look."""
        self._wake = wake

    def begin(self, held: bool) -> None:
        now = self._clock.now()
        was_gone = not self.beating(now)
        self.last_call = now
        if held:
            self.open += 1
        if was_gone:
            self._wake()

    def end(self, held: bool) -> None:
        self.last_call = self._clock.now()
        if held:
            self.open -= 1

    def beating(self, now: float) -> bool:
        return self.open > 0 or now - self.last_call <= self.within

    def quiet_at(self) -> float:
        """When the app counts as gone if it calls no more."""
        return float("inf") if self.open > 0 else self.last_call + self.within


class AppCheck:
    """Runs the checks (`run`, a supervised task) and keeps `up`; tells listeners each change.
    A threshold counts checks in a row, as a Kubernetes probe does: a flapping app must fail
    ``failures`` times in a row to count as down, and succeed ``successes`` times in a row to
    count as up again, so it cannot move the lease at every blip."""

    def __init__(
        self,
        settings: AppCheckSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat: Heartbeat | None = None,
        count: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.heartbeat = heartbeat or Heartbeat(settings.heartbeat or 0.0, clock)
        self._count = count
        self._probe_up = False  # the HTTP check's verdict after its thresholds
        self._in_a_row = 0  # checks in a row against the verdict
        self.up = False
        self.since = clock.now()  # when `up` last changed
        self.last_problem: str | None = "not checked yet"
        self._listeners: tuple[Callable[[bool], None], ...] = ()
        self._changed = asyncio.Event()  # a call after a quiet spell: judge now
        self._flipped = asyncio.Event()  # replaced at every change of `up` (`wait_for`)
        self._throttle = Throttle()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.heartbeat.on_call(self._called)

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """``listener(up)`` on the election's loop at every change of `up`."""
        self._listeners = (*self._listeners, listener)

    def _called(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._changed.set)

    async def wait_for(self, up: bool, timeout: float) -> bool:
        """Wait until `up` is ``up`` or ``timeout`` passes; True if it is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.up is not up:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._flipped.wait()
        return True

    def _judge(self) -> None:
        settings = self.settings
        up = True
        problem: str | None = None
        if settings.health_url is not None and not self._probe_up:
            up, problem = False, self.last_problem or "the health check has not passed yet"
        if settings.heartbeat is not None and not self.heartbeat.beating(self._clock.now()):
            up = False
            problem = problem or (
                f"the app has not called the localhost API for {settings.heartbeat:g}s"
            )
        self.become(up, problem)

    def become(self, up: bool, problem: str | None = None) -> None:
        """Take the verdict ``up`` (``problem``: why it is down), telling the listeners if it
        changed."""
        if not up:
            self.last_problem = problem
        if up == self.up:
            return
        self.up = up
        self.since = self._clock.now()
        log(
            logger,
            "info" if up else "warning",
            "the app is up" if up else "the app is down",
            **({} if up else {"reason": problem}),
        )
        flipped, self._flipped = self._flipped, asyncio.Event()
        flipped.set()
        for listener in self._listeners:
            listener(up)

    def _record(self, outcome: str, problem: str | None) -> None:
        """One HTTP check's outcome, through the thresholds."""
        self._count(outcome)
        success = outcome == "up"
        if success == self._probe_up:
            self._in_a_row = 0
        else:
            self._in_a_row += 1
            needed = self.settings.successes if success else self.settings.failures
            if self._in_a_row >= needed:
                self._probe_up, self._in_a_row = success, 0
        if not success:
            self.last_problem = problem
            if self._throttle.allow():
                log(
                    logger,
                    "info",
                    "app health check failed",
                    outcome=outcome,
                    error=problem,
                    in_a_row=self._in_a_row,
                    suppressed=self._throttle.take_suppressed(),
                )

    async def check_once(self, session: object) -> None:
        """One GET of the health URL (``session``: an aiohttp ClientSession)."""
        import aiohttp

        assert isinstance(session, aiohttp.ClientSession)
        assert self.settings.health_url is not None
        try:
            async with asyncio.timeout(self.settings.timeout):
                async with session.get(self.settings.health_url, allow_redirects=False) as response:
                    status = response.status
                    response.close()  # the body is never read: a huge answer costs nothing
        except TimeoutError:
            self._record("timeout", f"no answer within {self.settings.timeout:g}s")
            return
        except (aiohttp.ClientError, OSError) as exc:
            self._record("refused", str(exc) or type(exc).__name__)
            return
        if 200 <= status < 300:
            self._record("up", None)
        elif 300 <= status < 400:
            self._record("redirect", f"answered {status} (redirects are not followed)")
        else:
            self._record("down", f"answered {status}")

    async def run(self) -> None:
        """Check every period (and at each heartbeat after a quiet spell) until cancelled."""
        self._loop = asyncio.get_running_loop()
        settings = self.settings
        session = None
        if settings.health_url is not None:
            import aiohttp

            session = aiohttp.ClientSession(
                # A connection each time, never pooled: an app that holds one open learns
                # nothing from it, and a dead app's socket is not reused.
                connector=aiohttp.TCPConnector(force_close=True, limit=1),
                # The pod's own address: never through the app's outbound proxy.
                trust_env=False,
                max_field_size=8190,
                max_line_size=8190,
            )
        next_check = self._clock.now()
        try:
            while True:
                if session is not None and self._clock.now() >= next_check:
                    next_check = self._clock.now() + settings.period
                    await self.check_once(session)
                self._judge()
                now = self._clock.now()
                wait = next_check - now if session is not None else 1.0
                if settings.heartbeat is not None and self.up:
                    # Wake when the app counts as gone if it stays quiet.
                    quiet = self.heartbeat.quiet_at() - now
                    wait = min(wait, quiet + 0.001)
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, wait)):
                        await self._changed.wait()
        finally:
            if session is not None:
                await session.close()
