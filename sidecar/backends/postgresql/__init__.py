"""The PostgreSQL store: leases in the database an app already runs, and a fence for the app's
own transactions in that same database.

Layout (schema ``leader_sidecar``, created on first use when the role may, else by
``leader-sidecar postgresql-schema``): ``leases`` (one row per lease: the record), ``grants``
(the term of each lease's newest grant, written only by grants) and ``candidates``; the function
``fence(lease, term)`` for the app (see `schema`).

* Each ownership step is one conditional statement (rule 1): a grant names the version the
  candidate watched unchanged for a lease (or saw released); renew and release match holder
  and term. Terms come from the rows and only grow (rule 5); a holder the store forgot puts
  its grant back; a follower that saw a loss writes a loss marker. No statement compares a
  time: expiry is observed by the sidecars on their own clocks (rule 2).
* Every change of a lease row is announced with ``NOTIFY`` in the writer's transaction (a
  trigger); a client's one LISTEN session fans them out to its watches and reads every watched
  row again after each reconnection (`hub`).
* Every statement is bounded by a server-side ``statement_timeout`` below the request timeout,
  and by the request timeout at the client. Every failure is `StoreUnavailable` naming the
  cause (`errors`), logged once per problem, and starts a new *epoch*: versions seen before it
  grant nothing (a failover to a standby that missed writes may show an older row again).

* `description` — the store as the sidecar knows it: its URL, its driver, its command.
* `target` — the ``--store`` URL, checked at start-up.
* `schema` — the DDL, the statements and the records they decode to.
* `client` — the pool, the epoch, the schema check and error reporting.
* `hub` — the one LISTEN connection, fanned out to the watches and group followers.
* `lease` — one lease: the contract's requests and its watch.
* `candidates` — the candidate registry of a group.
* `command` — ``leader-sidecar postgresql-schema``: the schema and grants, for a DBA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.description import StoreConfig
    from sidecar.backends.postgresql.client import PostgresLeaseStore, PostgresStoreClient
    from sidecar.backends.postgresql.lease import PostgresLease
    from sidecar.backends.postgresql.target import PostgresTarget, parse_target
    from sidecar.supervisor import Supervisor

# Imported when first used, not with the package: the driver (asyncpg) is an optional extra,
# and ``postgresql-schema --help`` / ``--print`` and the --store check must work without it.
_LAZY = {
    "PostgresStoreClient": "sidecar.backends.postgresql.client",
    "PostgresLease": "sidecar.backends.postgresql.lease",
    "PostgresLeaseStore": "sidecar.backends.postgresql.client",
    "PostgresTarget": "sidecar.backends.postgresql.target",
    "parse_target": "sidecar.backends.postgresql.target",
}

__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "PostgresLease",
    "PostgresLeaseStore",
    "PostgresStoreClient",
    "PostgresTarget",
    "open_postgresql_client",
    "open_postgresql_store",
    "parse_target",
]


def open_postgresql_client(
    config: StoreConfig, supervisor: Supervisor | None = None
) -> PostgresStoreClient:
    """The client for ``--store postgresql://…``, shared by every lease of the sidecar; its
    LISTEN session runs under ``supervisor``."""
    from sidecar.backends.postgresql.client import PostgresStoreClient
    from sidecar.backends.postgresql.target import parse_target

    return PostgresStoreClient(
        parse_target(config.store),
        request_timeout=config.timing.request_timeout,
        application_name=f"leader-sidecar:{config.identity}",
        supervisor=supervisor,
    )


def open_postgresql_store(config: StoreConfig) -> PostgresLeaseStore:
    """The store of ``--lease`` alone, on a client of its own."""
    from sidecar.backends.postgresql.client import PostgresLeaseStore
    from sidecar.backends.postgresql.target import parse_target

    return PostgresLeaseStore(
        parse_target(config.store),
        config.lease,
        request_timeout=config.timing.request_timeout,
        application_name=f"leader-sidecar:{config.identity}",
    )
