"""``leader-sidecar``: parse the configuration, run until SIGTERM/SIGINT, release, exit."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from sidecar import logs
from sidecar.config import Config, ConfigError, load
from sidecar.redact import Scrubber, secret_values

logger = logging.getLogger("sidecar")

EXIT_CONFIG = 2


async def serve(config: Config, scrub: Scrubber) -> int:
    from sidecar.app import Sidecar

    try:
        sidecar = Sidecar(config, scrub=scrub)
    except ConfigError as exc:  # a store's own checks, e.g. a TLS file that does not load
        print(f"leader-sidecar: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        await sidecar.start()
    except OSError as exc:
        logs.log(logger, "error", "cannot listen", error=str(exc))
        await sidecar.stop()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stopping = asyncio.create_task(stop.wait())
    election_ended = asyncio.create_task(sidecar.wait())
    await asyncio.wait([stopping, election_ended], return_when=asyncio.FIRST_COMPLETED)
    for task in (stopping, election_ended):
        task.cancel()
    await sidecar.stop()
    return 0 if stop.is_set() else 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"leader-sidecar: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    scrub = Scrubber(
        secret_values(
            [config.store, config.redis_password, config.redis_sentinel_password], os.environ
        )
    )
    logs.configure(config.log_format, config.log_level, scrub)
    # The *_created series double every counter's output and no alert or dashboard uses them.
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]
    return asyncio.run(serve(config, scrub))
