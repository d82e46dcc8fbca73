"""The test servers themselves: a standalone server serves, an ensemble elects a leader, stops
serving with two members down and serves again once one is back."""

from __future__ import annotations

import time

import pytest

from tests.zookeeper.servers import ensemble, four_letter, standalone

pytestmark = pytest.mark.slow


def test_a_standalone_server_serves_on_its_own_port() -> None:
    with standalone() as server:
        assert server.mode() == "standalone"
        assert four_letter(server.client_port, "ruok") == "imok"
    assert not server.running()


def test_an_ensemble_loses_and_regains_its_quorum() -> None:
    with ensemble() as members:
        assert sorted(m.mode() for m in members.members) == ["follower", "follower", "leader"]
        leader = members.leader()
        killed, paused = (m for m in members.members if m is not leader)
        killed.kill()
        paused.pause()
        # Alone, the leader loses its quorum within syncLimit ticks and stops serving.
        deadline = time.monotonic() + 10
        while leader.serving():
            assert time.monotonic() < deadline, "a member without a quorum kept serving"
            time.sleep(0.05)
        paused.resume()
        members.wait_serving()
        assert sorted(m.mode() for m in members.members if m.running()) == ["follower", "leader"]
