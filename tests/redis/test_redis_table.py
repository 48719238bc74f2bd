"""The Redis backend against the in-memory table (the reference) and against faults: a server
paused or killed mid-use, wrong password or port, a Redis Cluster, a second process, checkpoints.

Every server is started by the test (tests/redis_server.py) on a free 127.0.0.1 port and killed by
its pid in a fixture teardown."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dualemb.core import Table, initializers, checkpoint
from redis_server import RedisServer
from redis_tables import assert_same_rows, fresh_name, random_ops_alike, redis_table, rows


def test_random_ops_match_the_memory_table_bit_for_bit(server):
    init = initializers.normal(0.0, 1.0, seed=11)
    opt = {"name": "adam", "beta_1": 0.8}
    red = redis_table(server, dim=5, initializer=init, optimizer=opt,
                      redis={"storage_slice": 3, "keys_sending_size": 7})
    mem = Table(dim=5, initializer=init, optimizer=opt)
    random_ops_alike(red, mem, steps=40, span=30, max_batch=40, erase=3)
    assert_same_rows(red, mem)
    assert red.slot_names == mem.slot_names and len(red.slot_names) == 2


def test_a_second_process_sees_the_rows_and_optimizer(server):
    name = fresh_name("persist")
    t = redis_table(server, dim=3, name=name, optimizer="adagrad")
    keys = np.array([7, 8, 9])
    t.apply_gradients(keys, np.ones((3, 3), np.float32), lr=0.5, step=1)
    expected = t.find(keys)[0]
    code = (
        "import numpy as np, sys\n"
        "from dualemb.core import Table\n"
        f"t = Table(dim=3, backend={{'redis': {{'name': {name!r}, 'addresses': ['{server.address}']}}}})\n"
        "v, e = t.find(np.array([7, 8, 9]))\n"
        "print(repr(v.tolist()), bool(e.all()), t.size(), t.slot_names)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{expected.tolist()!r} True 3 ['accumulator']"


def test_names_tags_shards_and_dbs_never_collide(server):
    a = redis_table(server, name="x", redis={"shard": 0})
    b = redis_table(server, name="x", redis={"shard": 1})
    c = redis_table(server, name="x", redis={"model_tag": "other"})
    d = redis_table(server, name="x", redis={"db": 3})
    e = redis_table(server, name="x/0")  # escaping: not the same as name "x", shard 0
    tables = [a, b, c, d, e]
    for i, t in enumerate(tables):
        t.insert_or_assign(np.array([1, 2 + i]), np.full((2, 4), float(i), np.float32))
    for i, t in enumerate(tables):
        r = rows(t)
        assert r["keys"].tolist() == [1, 2 + i]
        np.testing.assert_array_equal(r["values"], np.full((2, 4), float(i), np.float32))
        assert t.size() == 2


def test_same_identity_other_dim_is_refused(server):
    redis_table(server, dim=4, name="dimcheck")
    with pytest.raises(ValueError, match="exists with dim 4"):
        redis_table(server, dim=8, name="dimcheck")


def test_paused_server_gives_a_clear_error_in_bounded_time_and_nothing_changes(server):
    t = redis_table(server)
    keys = np.array([1, 2, 3])
    t.insert_or_assign(keys, np.ones((3, 4), np.float32))
    server.pause()
    try:
        for call in (lambda: t.find(keys),
                     lambda: t.insert_or_assign(keys, np.zeros((3, 4), np.float32)),
                     lambda: t.size()):
            start = time.monotonic()
            with pytest.raises(ValueError, match=r"redis at 127\.0\.0\.1:\d+.* did not answer within 500 ms"):
                call()
            # Bounded by the configured timeouts (connect + command), with slack for a busy host.
            assert time.monotonic() - start < 10
    finally:
        server.resume()
    v, e = t.find(keys)  # reconnects; the refused write changed nothing
    assert e.all()
    np.testing.assert_array_equal(v, np.ones((3, 4), np.float32))


def test_killed_server_errors_and_a_restarted_one_works_again(server):
    t = redis_table(server)
    t.insert_or_assign(np.array([5]), np.ones((1, 4), np.float32))
    server.stop()
    # The first call finds the connection closed, the next one cannot reconnect.
    with pytest.raises(ValueError, match=r"redis at 127\.0\.0\.1:\d+: connection lost"):
        t.find(np.array([5]))
    with pytest.raises(ValueError, match=r"cannot connect to redis at 127\.0\.0\.1:\d+ .*refused"):
        t.insert_or_assign(np.array([6]), np.ones((1, 4), np.float32))
    server.restart()  # no persistence: the restarted server is empty
    v, e = t.find(np.array([5]))
    assert not e.any()
    t.insert_or_assign(np.array([6]), np.full((1, 4), 2.0, np.float32))
    np.testing.assert_array_equal(t.find(np.array([6]))[0], np.full((1, 4), 2.0, np.float32))


def test_wrong_password_and_wrong_port_are_clear_errors():
    s = RedisServer(password="s3cret")
    try:
        with pytest.raises(ValueError, match="NOAUTH|Authentication"):
            redis_table(s)
        with pytest.raises(ValueError, match="AUTH .*failed.*(WRONGPASS|invalid)"):
            redis_table(s, redis={"password": "nope"})
        t = redis_table(s, redis={"password": "s3cret"})
        t.insert_or_assign(np.array([1]), np.ones((1, 4), np.float32))
        assert t.size() == 1
    finally:
        s.cleanup()
    with pytest.raises(ValueError, match="cannot connect to redis at 127.0.0.1:.*refused"):
        redis_table(["127.0.0.1:1"])


def test_bad_redis_config_names_the_member(server):
    with pytest.raises(ValueError, match="unknown redis config parameter 'hosts'"):
        Table(dim=2, backend={"redis": {"name": "a", "hosts": ["x"]}})
    with pytest.raises(ValueError, match="'db' must be an integer"):
        Table(dim=2, backend={"redis": {"name": "a", "db": "0"}})
    with pytest.raises(ValueError, match="needs 'name'"):
        Table(dim=2, backend={"redis": {"addresses": [server.address]}})
    with pytest.raises(ValueError, match="capacity"):
        redis_table(server, capacity=10)


def test_describe_round_trips_the_redis_config(server):
    t = redis_table(server, redis={"storage_slice": 2})
    config, _ = t.describe()
    again = Table(dim=config["dim"], backend={"redis": config["redis"]})
    assert again.describe() == t.describe()
    # The core's text is Python's canonical JSON byte for byte (exact types kept).
    from dualemb.core.spec import canonical
    from dualemb.core.table import _core
    text = _core.describe(t.id)
    text = text.decode() if isinstance(text, bytes) else text
    assert text == canonical(json.loads(text))
    assert config["backend"] == "redis" and config["redis"]["storage_slice"] == 2


def test_checkpoint_moves_a_table_between_redis_and_memory(server, tmp_path):
    red = redis_table(server, dim=3, optimizer="adam", initializer=initializers.uniform(-1, 1, seed=4))
    rng = np.random.default_rng(2)
    keys = rng.choice(1 << 40, 3000, replace=False)
    red.apply_gradients(keys, rng.normal(size=(3000, 3)).astype(np.float32), lr=0.1, step=1)
    checkpoint.save(tmp_path / "a", {"emb": red}, page_rows=500)
    mem = Table(dim=3, optimizer="adam", initializer=initializers.uniform(-1, 1, seed=4))
    checkpoint.load(tmp_path / "a", {"emb": mem})
    assert_same_rows(red, mem)
    checkpoint.save(tmp_path / "b", {"emb": mem})
    back = redis_table(server, dim=3, optimizer="adam")
    checkpoint.load(tmp_path / "b", {"emb": back})
    assert_same_rows(back, mem)


def test_cluster_tables_follow_moved_and_match_memory(cluster):
    # Every node is given as the only address once: two of them answer MOVED for the slot.
    for node in cluster.nodes:
        red = redis_table([node.address], dim=2, name=fresh_name("cl"),
                          redis={"mode": "cluster", "storage_slice": 4})
        mem = Table(dim=2)
        keys = np.arange(500) * 31
        vals = np.random.default_rng(3).normal(size=(500, 2)).astype(np.float32)
        for t in (red, mem):
            t.insert_or_assign(keys, vals)
            t.accum(keys[:100], vals[:100], np.ones(100, bool))
        assert red.size() == mem.size() == 500
        assert_same_rows(red, mem)


def test_cluster_refuses_db_other_than_zero(cluster):
    with pytest.raises(ValueError, match="only db 0"):
        redis_table([cluster.nodes[0].address], redis={"mode": "cluster", "db": 1})


def test_clone_and_background_save_are_refused(server, tmp_path):
    """A Redis table's rows live in the server: no in-process copy, so no background save."""
    t = redis_table(server)
    t.insert_or_assign([1, 2], np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="cannot be copied.*Redis"):
        t.clone()
    with pytest.raises(ValueError, match="cannot be copied.*Redis"):
        checkpoint.save(str(tmp_path / "c"), {"t": t}, blocking=False)
    assert not (tmp_path / "c").exists()
    assert t.size() == 2
