"""The official client's elector: ``kubernetes.aio.leaderelection`` with `LeaseLock`.

Used as documented, with its known traps worked around (TOOLING.md) and nothing else changed:
durations are whole seconds (a float lease crashes it), the retry period is at least 1 s (it
refuses less), the Lease must exist (its own create fails), and ``run()`` is restarted when a
transport error ends it. It never releases: SIGTERM simply ends the process. ``/leader`` is
``200`` between its ``onstarted_leading`` and ``onstopped_leading`` callbacks.

Several leases (``--lease a,b,c``, the brownout benchmark's 16 shards): one ``LeaderElection``
per lease on one ``ApiClient``, as a team using this client would write it (it has no notion of
several leases); ``/leader`` is then ``200`` while it leads any of them.

    python -m benchmarks.anchors.k8s_elector --kubeconfig F --namespace demo --lease l \
        --lease-duration 3 --renew-deadline 2 --retry-period 1
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from kubernetes.aio import config
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.leaderelection import electionconfig, leaderelection
from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

from benchmarks.anchors.endpoint import LeaderState, serve


class CountingLeaseLock(LeaseLock):
    """`LeaseLock` that counts its API requests (one per get/update)."""

    def __init__(self, state: LeaderState, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.state = state

    async def get(self, name, namespace):  # type: ignore[no-untyped-def]
        self.state.store_requests += 1
        return await super().get(name, namespace)

    async def update(self, name, namespace, updated_record):  # type: ignore[no-untyped-def]
        self.state.store_requests += 1
        return await super().update(name, namespace, updated_record)


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    state = LeaderState(f"{args.name}_{os.urandom(4).hex()}")
    configuration = Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    api = ApiClient(configuration)
    server = await serve(state, args.port)
    leading: set[str] = set()

    async def elect(lease: str) -> None:
        lock = CountingLeaseLock(state, lease, args.namespace, state.identity, api)

        async def started() -> None:
            leading.add(lease)
            state.lead()

        async def stopped() -> None:
            leading.discard(lease)
            if not leading:
                state.follow()

        while True:
            election = leaderelection.LeaderElection(
                electionconfig.Config(
                    lock,
                    lease_duration=args.lease_duration,
                    renew_deadline=args.renew_deadline,
                    retry_period=args.retry_period,
                    onstarted_leading=started,
                    onstopped_leading=stopped,
                )
            )
            try:
                await election.run()  # returns after losing the lease
            except Exception:  # a transport error ends run(): start over as a follower
                logging.warning("election ended by an error; restarting", exc_info=True)
            finally:
                await stopped()
            await asyncio.sleep(args.retry_period)

    try:
        await asyncio.gather(*(elect(lease) for lease in args.lease.split(",")))
    finally:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--lease", default="bench-official")
    parser.add_argument("--lease-duration", type=int, default=3)
    parser.add_argument("--renew-deadline", type=int, default=2)
    parser.add_argument("--retry-period", type=int, default=1)
    parser.add_argument("--name", default="official")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
