"""etcd's gRPC gateway (JSON over HTTP on the client port: ``/v3/kv/txn``, ``/v3/kv/range``,
``/v3/watch``) through aiohttp, set up the way a lease needs it.

Why the gateway and not a gRPC client: every etcd since 3.4 serves it on the client port, so
the sidecar talks to etcd through aiohttp, which it already carries, instead of adding grpcio
(the measurements are in docs/etcd.md). A lease needs a handful of requests: range, txn,
delete, authenticate, and one streaming POST per watch.

* **Endpoints, in order, failing over.** Requests go to the current endpoint. A request that
  could not be sent (connection refused: nothing reached the server) goes to the next one at
  once, within the same deadline; one that went out and got no answer, or an answer that the
  member cannot serve (no leader, request timed out: a member cut off from its quorum), fails
  and moves the client on, so the next request (the elector's retry, the watch's reconnect)
  goes to the next endpoint. Nothing is retried blindly: a write that timed out may have
  applied, and its caller decides from what the store holds.
* **Linearizable.** Every read is linearizable (no ``serializable``), so a member cut off from
  its quorum answers errors, never an old record.
* **Deadlines.** Every request is bounded by the request timeout here, and tells the server the
  same budget (``Grpc-Timeout``), so etcd drops work its client gave up on.
* **Users.** With ``--etcd-username`` the client authenticates (``/v3/auth/authenticate``) on
  first use and sends the token with every request; a token etcd no longer accepts (expired,
  the auth store moved on) is renewed once and the request sent again: etcd refuses such a
  request before it reaches the log, so nothing was applied. The token and the password are
  never logged.
* **Revisions.** etcd's revision only grows in the life of a cluster. A linearizable answer
  below one seen before, or from another cluster, means the cluster was restored from an
  older snapshot (or replaced): ``on_restore`` is called, and the client times every lease
  anew (see `sidecar.backends.etcd.client`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.etcd.target import EtcdTarget
from sidecar.logs import log

logger = logging.getLogger("sidecar.etcd")

USER_AGENT = "leader-sidecar"
# gRPC status codes the gateway puts in its error bodies.
UNAUTHENTICATED = 16
UNAVAILABLE = 14
DEADLINE_EXCEEDED = 4
# Messages of etcd errors that say "this member cannot serve now; another may".
_MEMBER_TROUBLE = (
    "no leader",
    "request timed out",
    "leader changed",
    "not capable",
    "stopped",
    "too many requests",
    "too many learner",
)
TIMEOUTS_TO_MOVE = 2  # requests in a row that time out on one member before moving on
AUTH_TIMEOUT = 5.0  # seconds an authentication may take, whatever the request timeout
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old", "auth: revision")


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


class EtcdError(Exception):
    """One failed request. ``status`` is the HTTP status (0: no answer), ``code`` the gRPC
    code etcd gave (0 when none), ``sent``: the request may have reached the server."""

    def __init__(
        self,
        op: str,
        status: int,
        message: str,
        *,
        code: int = 0,
        sent: bool = True,
        retry_after: float | None = None,
    ) -> None:
        where = f"HTTP {status}" if status else "no answer"
        super().__init__(f"{op}: {where}: {message}")
        self.op = op
        self.status = status
        self.code = code
        self.message = message
        self.sent = sent
        self.retry_after = retry_after

    @property
    def member_trouble(self) -> bool:
        """The member could not serve the request (unreachable, cut off from its quorum,
        overloaded): another endpoint may."""
        if self.status == 0 or self.status >= 500 or self.code in (UNAVAILABLE, DEADLINE_EXCEEDED):
            return True
        return any(text in self.message for text in _MEMBER_TROUBLE)

    @property
    def timed_out(self) -> bool:
        """No answer in time: the member may be gone, or only slow (a busy machine)."""
        return (self.status == 0 and "timed out" in self.message) or self.code == DEADLINE_EXCEEDED

    @property
    def stale_token(self) -> bool:
        return self.code == UNAUTHENTICATED or any(t in self.message for t in _STALE_TOKEN)


class EtcdApi:
    """The cluster's gateway: one aiohttp session, the current endpoint, the auth token."""

    def __init__(
        self,
        target: EtcdTarget,
        *,
        request_timeout: float,
        on_restore: Callable[[str], None] | None = None,
    ) -> None:
        self.target = target
        self.request_timeout = request_timeout
        self.on_restore = on_restore
        self._ssl = target.ssl_context()
        self._session: aiohttp.ClientSession | None = None
        self.current = 0  # index of the endpoint requests go to
        self._timeouts = 0  # requests in a row that timed out on the current endpoint
        self._token: str | None = None
        self._auth_task: asyncio.Future[str | None] | None = None
        self._auth_disabled_logged = False
        # The highest revision a linearizable answer showed, and the cluster it came from.
        self.revision = 0
        self.cluster_id: str | None = None
        self.requests = 0  # requests sent (tests count them, as client-go's tests do)

    # -- the session ------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # No limit here: watch streams each hold a connection for as long as they run;
                # the store client bounds the requests in flight itself.
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl if self._ssl else True),
                headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
            )
        return self._session

    async def close(self) -> None:
        if self._auth_task is not None:
            self._auth_task.cancel()
            await asyncio.gather(self._auth_task, return_exceptions=True)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def endpoint(self) -> str:
        return self.target.base_url(self.current)

    def move_on(self, failed: int, why: str) -> None:
        """Requests go to the endpoint after ``failed`` from now on (once per failure: a
        request that failed on an endpoint the client already left moves nothing)."""
        if len(self.target.endpoints) < 2 or failed != self.current:
            return
        self.current = (failed + 1) % len(self.target.endpoints)
        self._timeouts = 0
        log(
            logger,
            "warning",
            "etcd endpoint failing; moving to the next",
            failed=self.target.base_url(failed),
            next=self.endpoint,
            error=why,
        )

    # -- requests ---------------------------------------------------------------------------

    async def call(
        self, op: str, path: str, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` (``/v3/kv/txn``…) within ``timeout`` (default: the
        request timeout); the decoded answer. Raises `EtcdError`."""
        budget = self.request_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        renewed_token = False
        tried = 0
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise EtcdError(op, 0, f"timed out after {budget:.3f}s")
            index = self.current
            # What any answer to this request must show at least (linearizable: it was sent
            # after these answers came), whatever answers to other requests come meanwhile.
            floor, cluster = self.revision, self.cluster_id
            try:
                answer = await self._post(op, index, path, body, left)
            except EtcdError as error:
                if not error.sent and tried + 1 < len(self.target.endpoints):
                    # Nothing reached that member: the next one may answer, in this deadline.
                    tried += 1
                    self.move_on(index, str(error))
                    continue
                if error.stale_token and self.target.username and not renewed_token:
                    # Refused before it reached the log: renew the token and send it again.
                    renewed_token = True
                    await self._authenticate(index, stale=self._token)
                    continue
                if error.member_trouble:
                    self.failed_on(index, error)
                raise
            if index == self.current:
                self._timeouts = 0
            self._check_header(answer.get("header"), floor, cluster)
            return answer

    def failed_on(self, index: int, error: EtcdError) -> None:
        """A request to endpoint ``index`` found its member unable to serve. A timeout alone
        moves the client on only at the second in a row: one slow answer on a busy machine is
        no reason to leave a member (and every watch stream on it) for another."""
        if error.timed_out and index == self.current:
            self._timeouts += 1
            if self._timeouts < TIMEOUTS_TO_MOVE:
                return
        self.move_on(index, str(error))

    async def _post(
        self,
        op: str,
        index: int,
        path: str,
        body: dict[str, Any],
        budget: float,
        *,
        token: bool = True,
    ) -> dict[str, Any]:
        """``token``: send the user's token (authenticating first); not for the request that
        authenticates."""
        headers = await self._headers(index, budget, token=token)
        data = json.dumps(body, separators=(",", ":")).encode()
        sent = False
        self.requests += 1
        try:
            async with asyncio.timeout(budget):
                async with self._http().post(
                    self.target.base_url(index) + path,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=budget),
                ) as response:
                    sent = True
                    raw = await response.read()
                    status = response.status
                    retry_after = _retry_after(response.headers.get("Retry-After"))
        except TimeoutError:
            raise EtcdError(op, 0, f"timed out after {budget:.3f}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise EtcdError(op, 0, f"{type(exc).__name__}: {exc}", sent=False) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # aiohttp payload/connection errors, OSError, ssl errors
            raise EtcdError(op, 0, f"{type(exc).__name__}: {exc}", sent=sent) from exc
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": raw[:300].decode(errors="replace")}
        if not isinstance(answer, dict):
            answer = {"error": str(answer)[:300]}
        if 200 <= status < 300 and "error" not in answer:
            return answer
        message = str(answer.get("message") or answer.get("error") or "").strip()
        code = answer.get("code")
        raise EtcdError(
            op,
            status,
            message or f"HTTP {status}",
            code=code if isinstance(code, int) else 0,
            retry_after=retry_after,
        )

    @contextlib.asynccontextmanager
    async def stream(self, op: str, path: str, body: bytes) -> AsyncIterator[aiohttp.StreamReader]:
        """A streaming POST (a watch) to the current endpoint: the body's stream once the
        answer's headers are in (within the request timeout). No total timeout: the caller
        watches for silence. Raises `EtcdError`."""
        index = self.current
        budget = self.request_timeout
        headers = await self._headers(index, budget, deadline=False)
        self.requests += 1
        try:
            async with asyncio.timeout(budget):
                response = await self._http().post(
                    self.target.base_url(index) + path,
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=budget),
                )
        except TimeoutError:
            error = EtcdError(op, 0, f"timed out after {budget:.3f}s")
            self.failed_on(index, error)
            raise error from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.move_on(index, f"{type(exc).__name__}: {exc}")
            raise EtcdError(op, 0, f"{type(exc).__name__}: {exc}") from exc
        try:
            if response.status != 200:
                raw = await response.content.read(64 * 1024)
                error = EtcdError(op, response.status, raw.decode(errors="replace").strip())
                if error.member_trouble:
                    self.failed_on(index, error)
                raise error
            yield response.content
        finally:
            response.release()

    async def _headers(
        self, index: int, budget: float, *, deadline: bool = True, token: bool = True
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        if deadline:
            # The server gives up when we do (grpc-gateway's deadline header, milliseconds).
            headers["Grpc-Timeout"] = f"{max(1, int(budget * 1000))}m"
        if token and self.target.username:
            current = self._token or await self._authenticate(index, stale=None)
            if current:
                headers["Authorization"] = current
        return headers

    async def _authenticate(self, index: int, *, stale: str | None) -> str | None:
        """A token for the user. One authentication at a time, shared by every request that
        needs it, and not bounded by any one request's budget: etcd checks the password with
        bcrypt and commits the token through Raft, which can take longer than a short lease's
        request timeout, and a cancelled attempt would only start over. Raises `EtcdError`."""
        if self._token is not None and self._token != stale:
            return self._token
        if self._auth_task is None or self._auth_task.done():
            self._token = None
            self._auth_task = asyncio.ensure_future(self._fetch_token(index))
        return await asyncio.shield(self._auth_task)

    async def _fetch_token(self, index: int) -> str | None:
        body = {"name": self.target.username, "password": self.target.password or ""}
        budget = max(AUTH_TIMEOUT, self.request_timeout)
        try:
            answer = await self._post(
                "authenticate", index, "/v3/auth/authenticate", body, budget, token=False
            )
        except EtcdError as error:
            if "authentication is not enabled" in error.message:
                if not self._auth_disabled_logged:
                    self._auth_disabled_logged = True
                    log(
                        logger,
                        "warning",
                        "etcd has authentication disabled; --etcd-username is not used",
                        user=self.target.username,
                    )
                return None
            raise
        token = answer.get("token")
        self._token = str(token) if token else None
        return self._token

    def _check_header(self, header: Any, floor: int, cluster_before: str | None) -> None:
        """Note the revision of a linearizable answer. One below ``floor`` (the highest
        revision answered before this request was sent: requests in flight together may
        answer in any order), or from another cluster, means the store went back
        (`on_restore`)."""
        if not isinstance(header, dict):
            return
        try:
            revision = int(header.get("revision") or 0)
        except (TypeError, ValueError):
            return
        cluster = header.get("cluster_id")
        cluster = str(cluster) if cluster is not None else None
        why = None
        if cluster is not None and cluster_before is not None and cluster != cluster_before:
            why = f"answers come from another cluster ({cluster}, not {cluster_before})"
        elif revision < floor:
            why = (
                f"etcd's revision went back from {floor} to {revision}: the cluster was "
                "restored from an older snapshot"
            )
        if cluster is not None:
            self.cluster_id = cluster
        if why is not None:
            self.revision = revision
            if self.on_restore is not None:
                self.on_restore(why)
        else:
            self.revision = max(self.revision, revision)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def unavailable(error: EtcdError, target: EtcdTarget) -> StoreUnavailable:
    """The `StoreUnavailable` for a failed request, with the fix where there is one."""
    message = error.message
    hint = ""
    if "user name is empty" in message:
        hint = "; etcd has authentication enabled: give --etcd-username and --etcd-password"
    elif "invalid user ID or password" in message or "authentication failed" in message:
        hint = "; check --etcd-username and --etcd-password (LEADER_SIDECAR_ETCD_PASSWORD)"
    elif "CommonName of client" in message:
        hint = (
            "; with authentication on, etcd's gateway refuses a client certificate that has a "
            "CommonName: issue the sidecar's certificate without one (e.g. openssl -subj "
            "/O=leader-sidecar) and name the user with --etcd-username"
        )
    elif "permission denied" in message:
        hint = (
            f"; grant the user's role readwrite on the prefix: etcdctl role grant-permission "
            f"ROLE --prefix=true readwrite {target.prefix}/"
        )
    elif error.status == 0 and "SSL" in message:
        hint = "; check --etcd-ca-file (it must sign the members' certificates)"
    elif error.status == 0 and error.sent is False and "Connect" in message:
        hint = f"; no etcd member answers at {', '.join(_hosts(target))}"
    return StoreUnavailable(
        f"etcd {target.describe()}: {error}{hint}", retry_after=error.retry_after
    )


def _hosts(target: EtcdTarget) -> list[str]:
    return [target.base_url(i) for i in range(len(target.endpoints))]
