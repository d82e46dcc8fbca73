"""``leader-sidecar``: parse the configuration, run until SIGTERM/SIGINT, release, exit.
``leader-sidecar status`` and ``leader-sidecar transfer`` are in `sidecar.commands`."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from sidecar import logs
from sidecar.backends import store_commands
from sidecar.binding import ListenFailed
from sidecar.config import Config, load
from sidecar.config_error import ConfigError
from sidecar.redact import Scrubber, secret_values
from sidecar.signals import Signals

logger = logging.getLogger("sidecar")

EXIT_CONFIG = 2


async def serve(config: Config, scrub: Scrubber, signals: Signals) -> int:
    from sidecar.app import Sidecar

    try:
        sidecar = Sidecar(config, scrub=scrub)
    except ConfigError as exc:  # a store's own checks, e.g. a TLS file that does not load
        print(f"leader-sidecar: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    stop = asyncio.Event()
    signals.attach(
        asyncio.get_running_loop(),
        on_stop=stop.set,
        on_dump=lambda: logs.log(logger, "info", "state", **sidecar.state()),
        on_ignored=lambda name: logs.log(logger, "info", "signal ignored", signal=name),
    )
    try:
        try:
            await sidecar.start()
        except ConfigError as exc:  # a listen address that names nothing on this host
            await sidecar.stop()
            print(f"leader-sidecar: {scrub(str(exc))}", file=sys.stderr)
            return EXIT_CONFIG
        except ListenFailed as exc:  # a port in use: may come back, so 1, not 2
            await sidecar.stop()
            print(f"leader-sidecar: {scrub(str(exc))}", file=sys.stderr)
            return 1
        except OSError as exc:  # anything else the host refused at start
            logs.log(logger, "error", "cannot start", error=str(exc))
            await sidecar.stop()
            return 1
        stopping = asyncio.create_task(stop.wait())
        election_ended = asyncio.create_task(sidecar.wait())
        await asyncio.wait([stopping, election_ended], return_when=asyncio.FIRST_COMPLETED)
        for task in (stopping, election_ended):
            task.cancel()
        # Stop signals from here on only count: the shutdown below runs once, to the end.
        await sidecar.stop()
        if signals.repeated_stops:
            logs.log(logger, "info", "repeated stop signals ignored", count=signals.repeated_stops)
        return 0 if stop.is_set() else 1
    finally:
        signals.detach()


def scrubber(config: Config, environ: Mapping[str, str]) -> Scrubber:
    """What hides the secrets of this configuration: the store URL's passwords, the store's
    secret settings, and every variable whose name looks secret."""
    store_url = config.store if "://" in config.store else None  # a bare name is no secret
    return Scrubber(secret_values([store_url, *config.store_settings.secrets()], environ))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    store_command = store_commands().get(args[0]) if args else None
    if store_command is not None:  # a store's own, e.g. creating its schema
        return store_command.run(args[1:])
    if args and args[0] in ("status", "transfer", "hold", "resume"):
        from sidecar import commands

        run = {
            "status": commands.status_main,
            "transfer": commands.transfer_main,
            "hold": commands.hold_main,
            "resume": commands.resume_main,
        }[args[0]]
        return run(args[1:])
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"leader-sidecar: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    scrub = scrubber(config, os.environ)
    logs.configure(config.log_format, config.log_level, scrub)
    # The *_created series double every counter's output and no alert or dashboard uses them.
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]
    signals = Signals()
    signals.install()  # before the loop: a SIGTERM during start-up is an orderly stop too
    try:
        return asyncio.run(serve(config, scrub, signals))
    finally:
        signals.ignore_all()
