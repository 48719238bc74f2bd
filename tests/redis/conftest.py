"""Servers the Redis tests start on free 127.0.0.1 ports (tests/redis_server.py), each process
killed by its pid in the fixture's teardown, also when a test fails."""

import pytest

from redis_server import RedisCluster, running_server

# A fresh server per test (tests pause and kill it); a module may narrow it to module scope.
server = pytest.fixture(running_server)


@pytest.fixture(scope="module")
def cluster():
    """A 3-master Redis Cluster shared by a module's tests."""
    c = RedisCluster(3)
    try:
        yield c
    finally:
        c.cleanup()
