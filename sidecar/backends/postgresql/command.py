"""``leader-sidecar postgresql-schema``: the PostgreSQL store's schema, for a DBA to create once
when the sidecar's own role may not (and to grant that role exactly what it needs).

    leader-sidecar postgresql-schema --store postgresql://admin@db/app --grant sidecar \\
        --fence-role app
    leader-sidecar postgresql-schema --print --grant sidecar     # the SQL, to run by hand
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from sidecar.backends.postgresql.description import check_url
from sidecar.config_error import ConfigError
from sidecar.redact import Scrubber, secret_values

PROG = "leader-sidecar postgresql-schema"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Create (or complete) the leader_sidecar schema in a PostgreSQL database and grant a "
            "role the least privileges the sidecar needs. Run it once as a role that may "
            "create schemas (the schema's owner); the sidecar itself then needs no CREATE "
            "privilege. Safe to run again. Connecting needs the PostgreSQL driver: "
            "pip install 'leader-sidecar[postgresql]'."
        ),
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("LEADER_SIDECAR_STORE"),
        help="postgresql://… of the database, as the owner (default: LEADER_SIDECAR_STORE); "
        "the password may come from PGPASSWORD or a password file",
    )
    parser.add_argument(
        "--grant",
        metavar="ROLE",
        action="append",
        default=[],
        help="grant ROLE what the sidecar needs (repeatable)",
    )
    parser.add_argument(
        "--fence-role",
        metavar="ROLE",
        action="append",
        default=[],
        help="grant ROLE what an app needs to call leader_sidecar.fence() (repeatable)",
    )
    parser.add_argument(
        "--print",
        dest="print_sql",
        action="store_true",
        help="print the SQL instead of running it (no connection, no driver needed)",
    )
    return parser


def sql_script(grant: Sequence[str], fence_roles: Sequence[str]) -> str:
    from sidecar.backends.postgresql import schema

    statements = [schema.DDL.strip(), schema.MARK_VERSION.strip() + ";"]
    for role in grant:
        statements += [s + ";" for s in schema.sidecar_grants(schema.quote_ident(role))]
    for role in fence_roles:
        statements += [s + ";" for s in schema.fence_grants(schema.quote_ident(role))]
    return "BEGIN;\n" + "\n\n".join(statements) + "\nCOMMIT;\n"


async def apply(url: str, grant: Sequence[str], fence_roles: Sequence[str]) -> list[str]:
    """Create the schema on ``url`` and grant; returns what was done, one line each."""
    from sidecar.backends.postgresql import schema
    from sidecar.backends.postgresql.connection import (
        PostgresConnection,
        create_schema,
        ensure_schema,
    )
    from sidecar.backends.postgresql.target import parse_target

    client = PostgresConnection(parse_target(url), request_timeout=30.0)
    done = []
    connection = await client.connect()
    try:
        await create_schema(connection)
        done.append(f"schema {schema.SCHEMA} is complete (version {schema.SCHEMA_VERSION})")
        async with connection.transaction():
            for role in grant:
                for statement in schema.sidecar_grants(schema.quote_ident(role)):
                    await connection.execute(statement)
                done.append(f"granted {role} the sidecar's privileges")
            for role in fence_roles:
                for statement in schema.fence_grants(schema.quote_ident(role)):
                    await connection.execute(statement)
                done.append(f"granted {role} the use of {schema.SCHEMA}.fence()")
        await ensure_schema(connection, create=False)
    finally:
        await connection.close()
    return done


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.print_sql:
        sys.stdout.write(sql_script(args.grant, args.fence_role))
        return 0
    if not args.store:
        print(f"{PROG}: --store is required (or LEADER_SIDECAR_STORE)", file=sys.stderr)
        return 2
    scrub = Scrubber(secret_values([args.store], os.environ))
    try:
        url = args.store.strip()
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        url = check_url(url)
    except (ValueError, ConfigError) as exc:
        print(scrub(f"{PROG}: --store: {exc}"), file=sys.stderr)
        return 2
    # (check_url above has refused a missing driver, with the extra to install)
    try:
        done = asyncio.run(apply(url, args.grant, args.fence_role))
    except Exception as exc:  # asyncpg, the socket, TLS: one line, no traceback, no secret
        print(scrub(f"{PROG}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    for line in done:
        print(line)
    return 0
