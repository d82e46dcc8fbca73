"""Session-wide: the one PostgreSQL server the tests share (started on first use by
`tests.postgresql.servers.shared_server`) is stopped when the session ends."""

from __future__ import annotations

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.postgresql.servers import stop_shared_server

    stop_shared_server()
