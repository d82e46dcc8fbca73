"""Replaying recorded exchanges against the fake and comparing what comes back.

Values the server chooses (resourceVersions, uids, generated names) differ between the real
server and the fake, so the replayer learns a mapping from each pair of responses and
rewrites later requests with it. Bodies are compared by *shape* — every key, in the server's
order, with the JSON type of its value — and, where the value is the point, exactly: Status
bodies, specs, labels, annotations and Table cells other than Age.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import aiohttp

from tests.fakekube.discovery import recorded

# Fields whose content the fake only approximates (documented in kinds.fields_v1) or cannot
# have (admission plugins that add volumes for the service account token).
APPROXIMATE = frozenset({"managedFields", "volumes", "volumeMounts"})


def shape(value: Any) -> Any:
    """Keys in order with the type of each value; a list by its first element."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items() if key not in APPROXIMATE]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def exchange(topic: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(recorded(topic)[name])


class Replayer:
    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url
        self.versions: dict[str, str] = {}
        self.uids: dict[str, str] = {}
        self.names: dict[str, str] = {}

    # -- learning the server's choices -----------------------------------------------------------

    def learn(self, recorded_body: Any, actual: Any) -> None:
        if isinstance(recorded_body, dict) and isinstance(actual, dict):
            meta_r, meta_a = recorded_body.get("metadata"), actual.get("metadata")
            if isinstance(meta_r, dict) and isinstance(meta_a, dict):
                for field, table in (
                    ("resourceVersion", self.versions),
                    ("uid", self.uids),
                    ("name", self.names),
                ):
                    if isinstance(meta_r.get(field), str) and isinstance(meta_a.get(field), str):
                        table[meta_r[field]] = meta_a[field]
            for key in ("items", "object", "rows"):
                self.learn(recorded_body.get(key), actual.get(key))
        elif isinstance(recorded_body, list) and isinstance(actual, list):
            for rec, act in zip(recorded_body, actual, strict=False):
                self.learn(rec, act)

    def learn_version(self, recorded_version: str | None, actual: str | None) -> None:
        if recorded_version and actual:
            self.versions[recorded_version] = actual

    def rewrite(self, value: Any, key: str = "") -> Any:
        """A recorded request value as this server's equivalent."""
        if isinstance(value, dict):
            return {k: self.rewrite(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.rewrite(item, key) for item in value]
        if isinstance(value, str):
            if key == "resourceVersion":
                return self.versions.get(value, value)
            if key == "uid":
                return self.uids.get(value, value)
            if key == "value" and value in self.versions:  # json-patch tests of the RV
                return self.versions[value]
        return value

    def rewrite_path(self, path: str) -> str:
        def version(match: re.Match[str]) -> str:
            return f"resourceVersion={self.versions.get(match[1], match[1])}"

        return re.sub(r"resourceVersion=(\d+)", version, path)

    def expected_text(self, text: str) -> str:
        """A recorded message with this server's resourceVersions in it."""
        known = {**self.versions, **self.uids}
        return re.sub(r"\(([-0-9a-f]+)\)", lambda m: f"({known.get(m[1], m[1])})", text)

    # -- sending --------------------------------------------------------------------------------

    async def send(
        self, request: dict[str, Any], *, token: str | None = "fake-token", path: str | None = None
    ) -> tuple[int, dict[str, str], Any, str]:
        headers = {
            key: value
            for key, value in (request.get("headers") or {}).items()
            if key not in ("Authorization",)
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        body = request.get("body")
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(self.rewrite(body)).encode()
        url = self.base_url + self.rewrite_path(path or request["path"])
        async with self.session.request(
            request["method"], url, data=data, headers=headers
        ) as response:
            text = await response.text()
            try:
                parsed = json.loads(text) if text.strip() else None
            except ValueError:
                parsed = text
            return response.status, dict(response.headers), parsed, text

    async def replay(self, topic: str, name: str, **kwargs: Any) -> Any:
        """Send one recorded request; assert the status and the body as described above."""
        recorded_exchange = exchange(topic, name)
        status, headers, body, _ = await self.send(recorded_exchange["request"], **kwargs)
        expected = recorded_exchange["response"]
        where = f"{topic}/{name}"
        assert status == expected["status"], (where, status, body)
        assert headers.get("Content-Type") == expected["headers"].get("Content-Type"), (
            where,
            headers.get("Content-Type"),
        )
        if "Warning" in expected["headers"]:
            assert headers.get("Warning") == expected["headers"]["Warning"], where
        expected_body = expected.get("body")
        if isinstance(expected_body, dict):
            self.compare(where, expected_body, body)
            self.learn(expected_body, body)
        return body

    def compare(self, where: str, expected: dict[str, Any], actual: Any) -> None:
        assert isinstance(actual, dict), (where, actual)
        if expected.get("kind") == "Status" and expected.get("status") == "Failure":
            self.compare_status(where, expected, actual)
            return
        assert shape(actual) == shape(expected), (where, shape(actual), shape(expected))
        for field in ("spec",):
            if field in expected and expected.get("kind") == "Lease":
                assert actual[field] == self.rewrite(expected[field]), (where, field)
        for field in ("labels", "annotations"):
            want = (expected.get("metadata") or {}).get(field)
            if want is not None:
                assert actual["metadata"].get(field) == want, (where, field)

    def compare_status(self, where: str, expected: dict[str, Any], actual: dict[str, Any]) -> None:
        want = copy.deepcopy(expected)
        want["message"] = self.expected_text(want["message"])
        if want.get("reason") == "Invalid" and "patch: Invalid value" in want["message"]:
            # The message embeds the whole patched object, which differs in details.
            assert actual["reason"] == "Invalid", where
            assert actual["code"] == 422, where
            assert [c["field"] for c in actual["details"]["causes"]] == ["patch"], where
            assert actual["message"].endswith(want["message"].rsplit(": ", 1)[1]), where
            return
        if "\n@@" in want["message"]:
            # The server appends a diff of its internal Go structs; the fake stops before it.
            want["message"] = want["message"].split("\n@@")[0]
            for cause in want["details"]["causes"]:
                cause["message"] = cause["message"].split("\n@@")[0]
        details = want.get("details") or {}
        if "uid" in details:
            details["uid"] = self.uids.get(details["uid"], details["uid"])
        assert actual == want, (where, actual, want)
