"""How the PostgreSQL store connects and fails, against real servers: passwords from the URL,
PGPASSWORD and a password file; TLS with a CA and a client certificate; several hosts finding
the primary; a role with only the documented privileges; a locked table; terminated sessions."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.postgresql.connection import SchemaMissing
from tests.contract.test_contract import LEASE, take, watching
from tests.postgresql.conftest import ClientFactory, Database
from tests.postgresql.servers import PostgresServer, make_directory
from tests.redis.servers import TlsFiles
from tests.support.tools import REPO


def create_role(database: Database, role: str, password: str, *extra: str) -> None:
    database.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' {' '.join(extra)}")


async def test_the_password_may_come_from_pgpassword_or_a_password_file(
    database: Database, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No password in the URL: PGPASSWORD, then a passfile=, each work."""
    create_role(database, "envpass", "s3cret-env", "SUPERUSER")
    monkeypatch.setenv("PGPASSWORD", "s3cret-env")
    record = await take(make_client(database.url_as("envpass", None)).lease("a"), "a_1")
    assert record.holder == "a_1"
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{database.server.port}:*:envpass:s3cret-env\n")
    passfile.chmod(0o600)
    url = database.url_as("envpass", None, passfile=str(passfile))
    record = await take(make_client(url).lease("b"), "b_1")
    assert record.holder == "b_1"
    with pytest.raises(StoreUnavailable, match="authentication refused"):
        await make_client(database.url_as("envpass", "wrong")).lease("c").read()


async def test_a_role_with_only_the_documented_privileges_runs_everything(
    database: Database, make_client: ClientFactory
) -> None:
    """Without CREATE the sidecar cannot make the schema and says what to run; after the DBA's
    `leader-sidecar postgresql-schema --grant`, the least-privileged role acquires, renews,
    watches, hands over, releases, marks a loss and keeps candidates; an app role with only
    --fence-role can fence and nothing more."""
    create_role(database, "sidecar_min", "pw-min")
    create_role(database, "app_min", "pw-app")
    database.sql(f"REVOKE CREATE ON DATABASE {database.name} FROM PUBLIC")
    database.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    url = database.url_as("sidecar_min", "pw-min")
    with pytest.raises(SchemaMissing, match="leader-sidecar postgresql-schema"):
        await make_client(url).lease("jobs").read()
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "sidecar",
            "postgresql-schema",
            "--store",
            database.url,
            "--grant",
            "sidecar_min",
            "--fence-role",
            "app_min",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "granted sidecar_min" in done.stdout
    a, b = make_client(url).lease("jobs"), make_client(url).lease("jobs")
    granted = await take(a, "a_1")
    async with watching(b) as seen:
        await asyncio.wait_for(seen.get(), 5)
        renewed = await a.renew("a_1", granted.term, LEASE)
        while (await asyncio.wait_for(seen.get(), 5)) != renewed:
            pass
    handed = await a.hand_over(
        "a_1", granted.term, successor="b_1", handed="1", duration=LEASE, min_term=0
    )
    assert (await b.release("b_1", handed.term)) is not None
    await a.delete_everything()
    assert (await b.mark_lost(handed.term, LEASE)) is not None
    group = make_client(url).candidates("g")
    from sidecar.backends.base import Candidate

    await group.beat(Candidate("a_1", "", "r", 0, False, None), LEASE)
    assert [c.identity for c in await group.list()] == ["a_1"]
    await group.leave("a_1")
    # The app's role: the fence, and no table.
    import asyncpg

    app = await asyncpg.connect(database.url_as("app_min", "pw-app"))
    try:
        with pytest.raises(asyncpg.PostgresError) as refused:
            await app.fetchval("SELECT leader_sidecar.fence('jobs', 1)")
        assert refused.value.sqlstate == "LS001"
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.fetch("SELECT * FROM leader_sidecar.grants")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.execute("UPDATE leader_sidecar.leases SET term = term + 1")
    finally:
        await app.close()


async def test_a_role_that_may_create_makes_the_schema_on_first_use(
    database: Database, make_client: ClientFactory
) -> None:
    create_role(database, "owner_role", "pw-owner")
    database.sql(f"GRANT CREATE ON DATABASE {database.name} TO owner_role")
    client = make_client(database.url_as("owner_role", "pw-owner"))
    assert await client.lease("jobs").read() is None
    assert (
        database.sql("SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'leader_sidecar'")
        == "owner_role"
    )


async def test_a_locked_table_is_unavailability_within_the_request_timeout(
    database: Database, make_client: ClientFactory
) -> None:
    """A statement stuck behind a lock (here the whole table) is ended by the server's
    statement timeout: StoreUnavailable in time, then the store answers again."""
    client = make_client(database.url, request_timeout=0.5)
    granted = await take(client.lease("jobs"), "a_1")
    import asyncpg

    locker = await asyncpg.connect(database.url)
    try:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute("LOCK TABLE leader_sidecar.leases IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await client.lease("jobs").renew("a_1", granted.term, LEASE)
        assert time.monotonic() - began < 1.0
        await transaction.rollback()
    finally:
        await locker.close()
    renewed = await client.lease("jobs").renew("a_1", granted.term, LEASE)
    assert renewed.term == granted.term


async def test_terminated_sessions_reconnect_and_the_watch_reads_again(
    database: Database, make_client: ClientFactory
) -> None:
    """pg_terminate_backend of every sidecar session: the next requests reconnect, and the
    watch's LISTEN session comes back and reports the current record (a new epoch)."""
    holder = make_client(database.url)
    follower = make_client(database.url)
    granted = await take(holder.lease("jobs"), "a_1")
    async with watching(follower.lease("jobs")) as seen:
        first = await asyncio.wait_for(seen.get(), 5)
        assert first is not None
        connections = follower.hub.connections
        killed = database.server.terminate_sessions(database.name)
        assert killed >= 2
        again = await asyncio.wait_for(seen.get(), 10)
        assert again is not None
        assert again.version != first.version  # the same row, seen in a new epoch
        assert (again.holder, again.term) == ("a_1", granted.term)
        assert follower.hub.connections == connections + 1
    for attempt in range(3):
        try:
            await holder.lease("jobs").renew("a_1", granted.term, LEASE)
            break
        except StoreUnavailable:  # the pooled connection died with its session
            assert attempt < 2


@pytest.fixture
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PostgresServer, TlsFiles]]:
    files = TlsFiles.make(tmp_path_factory.mktemp("pg-tls"), "pg")
    directory = make_directory("pg-tls-")
    server_files = directory / "tls"
    server_files.mkdir()
    for source in (files.server_cert, files.server_key, files.ca_cert):
        shutil.copy(source, server_files / source.name)
    (server_files / files.server_key.name).chmod(0o600)
    if os.geteuid() == 0:
        for path in (server_files, *server_files.iterdir()):
            shutil.chown(path, "postgres", "postgres")
    server = PostgresServer.start(
        directory,
        settings={
            "ssl": "on",
            "ssl_cert_file": str(server_files / files.server_cert.name),
            "ssl_key_file": str(server_files / files.server_key.name),
            "ssl_ca_file": str(server_files / files.ca_cert.name),
        },
        hba=[
            "hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-ca",
            "host all all 127.0.0.1/32 reject",
        ],
    )
    try:
        yield server, files
    finally:
        server.destroy()


async def test_tls_verifies_the_server_and_presents_a_client_certificate(
    tls_server: tuple[PostgresServer, TlsFiles],
    make_client: ClientFactory,
    other_tls: TlsFiles,
) -> None:
    """verify-full with the right CA and a client certificate works; without the certificate
    the server refuses; with another CA the sidecar refuses the server, naming the check."""
    server, files = tls_server
    good = server.url(
        sslmode="verify-full",
        sslrootcert=str(files.ca_cert),
        sslcert=str(files.client_cert),
        sslkey=str(files.client_key),
    )
    assert await make_client(good).lease("jobs").read() is None
    with pytest.raises(StoreUnavailable):
        await (
            make_client(server.url(sslmode="verify-full", sslrootcert=str(files.ca_cert)))
            .lease("jobs")
            .read()
        )
    with pytest.raises(StoreUnavailable, match="TLS"):
        await (
            make_client(
                server.url(
                    sslmode="verify-full",
                    sslrootcert=str(other_tls.ca_cert),
                    sslcert=str(files.client_cert),
                    sslkey=str(files.client_key),
                )
            )
            .lease("jobs")
            .read()
        )


@pytest.fixture(scope="session")
def other_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles.make(tmp_path_factory.mktemp("pg-tls-other"), "other")


@pytest.mark.slow
async def test_several_hosts_find_the_primary_also_after_a_promotion(
    make_client: ClientFactory,
) -> None:
    """A standby listed first is skipped (read-write by default); after the primary is gone and
    the standby promoted, the same URL reaches it."""
    primary = PostgresServer.start()
    standby = None
    try:
        standby = primary.standby()
        url = primary.url().replace(
            f"127.0.0.1:{primary.port}", f"127.0.0.1:{standby.port},127.0.0.1:{primary.port}"
        )
        client = make_client(url, request_timeout=3.0)
        granted = await take(client.lease("jobs"), "a_1")
        assert granted.term == 1
        primary.stop()
        standby.promote()
        deadline = time.monotonic() + 20
        while True:
            try:
                current = await client.lease("jobs").read()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the promoted standby was never reached"
                await asyncio.sleep(0.2)
        assert current is not None
        assert current.holder == "a_1"
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
