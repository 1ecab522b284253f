"""Fixtures of the Python binding tests: a directory server on free ports, and a deadline wait."""

import time

import pytest

from connex.directory_server import DirectoryServer


def wait_until(predicate, timeout=5.0, interval=0.01):
    """Polls `predicate` until it is true or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def server():
    s = DirectoryServer("127.0.0.1:0", "127.0.0.1:0", lease_ttl_ms=3000, heartbeat_ms=1000)
    s.start()
    yield s
    s.stop()
