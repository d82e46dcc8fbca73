"""What ``leader-sidecar status`` and ``transfer`` print is safe for the operator's terminal
(issue 25): an identity or an answer carrying escape sequences, CR/LF, bidirectional overrides
or bytes that are not UTF-8 comes out escaped, one row or one line each; ``transfer`` reaches
a loopback sidecar past ``http_proxy`` and reports an answer that is not JSON in one line.
Real processes, as an operator runs them."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from sidecar.backends.sqlite import SQLiteStoreClient
from sidecar.redact import printable, terminal_text

TERMINAL_TRICKS = (b"\x1b", b"\r", b"\x07", b"\xe2\x80\xae", b"\x00")  # (U+202E as UTF-8)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """The command's output as bytes, exactly as a terminal would get them."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    for proxy in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        environment.pop(proxy, None)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        env=environment,
        timeout=30,
        check=False,
    )


def assert_terminal_safe(output: bytes) -> str:
    for trick in TERMINAL_TRICKS:
        assert trick not in output, (trick, output[:300])
    return output.decode("utf-8")  # strict: no raw byte that is not UTF-8


def test_text_is_escaped_for_a_terminal() -> None:
    assert terminal_text("x\udcffy") == "x\\xffy"  # a byte that was not UTF-8
    assert terminal_text("a\u202eb\u200bc") == "a\\u202eb\\u200bc"  # reordering, invisible
    assert terminal_text("\ud800") == "\\ud800"
    assert printable("ünïcode ok") == "ünïcode ok"


def test_status_prints_what_a_hand_edit_put_in_the_store_escaped(tmp_path: Path) -> None:
    db = tmp_path / "leases.db"
    store = f"sqlite:///{db}"

    async def tables() -> None:  # (status itself creates none: issue 32)
        client = SQLiteStoreClient(str(db))
        await client.candidates("jobs").list()
        await client.close()

    asyncio.run(tables())
    now = datetime.now(UTC).isoformat()
    conn = sqlite3.connect(db)
    try:
        insert = (
            'INSERT INTO candidates ("group", identity, revision, priority, leaving, '
            "started_at, beat_at, version) VALUES ('jobs', ?, ?, 0, 0, NULL, ?, 1)"
        )
        conn.execute(insert, ("evil\x1b]0;owned\x07\r\nFORGED ROW", "", now))
        conn.execute(insert, (b"bytes\xff\xfe", "", now))
        conn.execute("UPDATE candidates SET identity = CAST(identity AS TEXT) WHERE 1")
        conn.execute(insert, ("rtl", "v1\u202eevil", now))
        conn.execute(
            "INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version) "
            "VALUES ('jobs', ?, 3, 15.0, 0, 'x', 7)",
            ("holder\x1b[2J",),
        )
        conn.commit()
    finally:
        conn.close()
    table = run("status", "--store", store, "--lease", "jobs")
    assert table.returncode == 0, table.stderr
    text = assert_terminal_safe(table.stdout)
    assert "\\x1b]0;owned\\x07\\r\\nFORGED ROW" in text
    assert "\\xff\\xfe" in text
    assert not [line for line in text.splitlines() if line.startswith("FORGED")]
    assert "unreadable" in text
    as_json = run("status", "--store", store, "--lease", "jobs", "-o", "json")
    assert as_json.returncode == 0
    assert_terminal_safe(as_json.stdout)


class _Answers(http.server.BaseHTTPRequestHandler):
    """A hostile ``--url``: each path answers what the test needs."""

    answers: ClassVar[dict[int, tuple[int, str, bytes]]] = {}  # by the server's port

    def do_POST(self) -> None:
        status, content_type, body = self.answers[self.server.server_address[1]]  # type: ignore[index]
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def answering(status: int, content_type: str, body: bytes) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    _Answers.answers[server.server_address[1]] = (status, content_type, body)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "content_type", "body", "wanted"),
    [
        (200, "text/html", b"<html>\x1b[2J\r\nYOU ARE OWNED</html>", "is not JSON"),
        (409, "application/json", b'{"error": "no\\u001b[31m\\r\\nforged"}', "refused (409)"),
        (500, "text/plain", b"\xff\xfe\x1b[2J" * 500, "refused (500)"),
    ],
    ids=["not-json", "json-error-with-escapes", "bytes"],
)
def test_transfer_reports_a_hostile_answer_in_one_escaped_line(
    status: int, content_type: str, body: bytes, wanted: str
) -> None:
    with answering(status, content_type, body) as url:
        result = run("transfer", "--url", url, "--to", "any")
    assert result.returncode == 1
    assert result.stdout == b""
    err = assert_terminal_safe(result.stderr)
    assert len(err.strip().splitlines()) == 1, err
    assert wanted in err
    assert len(err) < 2500


def test_transfer_reaches_a_loopback_sidecar_past_http_proxy() -> None:
    """``http_proxy`` is set for the app's outbound traffic; the sidecar is on loopback."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"  # nothing listens there
    answer = b'{"transferred": ["jobs"], "successor": "app-1_ab"}'
    with answering(200, "application/json", answer) as url:
        result = run(
            "transfer", "--url", url, "--to", "any", env={"http_proxy": dead, "HTTP_PROXY": dead}
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == answer
