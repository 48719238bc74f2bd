"""Redis Cluster with storage_slice > 1: a table's slices spread over the masters, batches that
span nodes keep the table contract when a node fails mid-batch, and tables written before the
slices were spread still read back (docs/redis.md).

Every cluster is started by the test on free 127.0.0.1 ports (tests/redis_server.py) and each
node is killed by its pid in the fixture's teardown, also when the test fails."""

import time

import numpy as np
import pytest

from dualemb.core import Table, initializers
from redis_server import RedisCluster, RedisServer
from redis_tables import assert_same_rows, fresh_name, random_ops_alike, redis_table, rows


def table(addresses, dim=4, name=None, mode="cluster", **kwargs):
    return redis_table(addresses, dim=dim, name=name or fresh_name("spread"), mode=mode, **kwargs)


def dbsizes(cluster):
    return [int(n.cli("DBSIZE")) for n in cluster.nodes]


def rows_per_master(cluster, name):
    """Rows of table `name` held by each master (HLEN of its slice hashes there)."""
    out = []
    for n in cluster.nodes:
        keys = [k for k in n.cli("--scan", "--pattern", f"de:*{name}/*:b*").splitlines() if k]
        out.append(sum(int(n.cli("HLEN", k)) for k in keys))
    return out


@pytest.fixture
def own_cluster():
    """A cluster of its own, with persistence: the test kills and restarts a node."""
    c = RedisCluster(3, persistent=True)
    try:
        yield c
    finally:
        c.cleanup()


def test_storage_slice_spreads_one_table_over_every_master(cluster):
    # TFRA's RedisTable with storage_slice 3 on 3 masters puts a slice on each; dualemb used to
    # put every slice in one hash slot (DBSIZE per master [0, 4, 0]).
    before = dbsizes(cluster)
    name = fresh_name("spread")
    t = table(cluster.addresses, name=name, redis={"storage_slice": 3})
    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, 300, replace=False).astype(np.int64)
    vals = rng.normal(size=(300, 4)).astype(np.float32)
    t.insert_or_assign(keys, vals)
    grown = [a - b for a, b in zip(dbsizes(cluster), before)]
    assert all(g > 0 for g in grown), f"Redis keys added per master: {grown}"
    per_master = rows_per_master(cluster, name)
    assert sum(per_master) == 300 and all(r > 0 for r in per_master), per_master
    assert t.size() == 300
    v, e = t.find(keys)
    assert e.all()
    np.testing.assert_array_equal(v, vals)
    got = rows(t)
    order = np.argsort(keys)
    np.testing.assert_array_equal(got["keys"], keys[order])
    np.testing.assert_array_equal(got["values"], vals[order])


def test_spread_table_matches_the_memory_table_bit_for_bit(cluster):
    init = initializers.normal(0.0, 1.0, seed=5)
    opt = {"name": "adam", "beta_1": 0.8}
    red = table(cluster.addresses, dim=5, initializer=init, optimizer=opt,
                redis={"storage_slice": 7, "keys_sending_size": 5})
    mem = Table(dim=5, initializer=init, optimizer=opt)
    random_ops_alike(red, mem, steps=42, span=40, max_batch=50, erase=5, with_restrict=True)
    assert_same_rows(red, mem)


def test_a_node_killed_mid_batch_leaves_the_table_as_it_was(own_cluster):
    c = own_cluster
    name = fresh_name("kill")
    t = table(c.addresses, dim=3, name=name, optimizer="adagrad", redis={"storage_slice": 3})
    keys = np.arange(300, dtype=np.int64) * 13
    g1 = np.random.default_rng(2).normal(size=(300, 3)).astype(np.float32)
    t.apply_gradients(keys, g1, lr=0.5, step=1)
    mem = Table(dim=3, optimizer="adagrad")
    mem.apply_gradients(keys, g1, lr=0.5, step=1)
    reference = rows(t)
    assert_same_rows(reference, mem)
    # A master holding a slice but not the table's meta: the batch claims the table, applies
    # the other slices, and then this node does not answer.
    meta_node = c.node_of(f"de:{{{name}/test/0}}:meta")
    victim = next(n for n, r in zip(c.nodes, rows_per_master(c, name)) if n is not meta_node and r)
    victim.cli("CLIENT", "PAUSE", "60000", "WRITE")  # its reads answer, its writes hang
    with pytest.raises(ValueError) as failed:
        t.apply_gradients(keys, np.ones((300, 3), np.float32), lr=0.5, step=2)
    msg = str(failed.value)
    assert "failed on slice" in msg and victim.address in msg, msg
    assert "it had been applied to slice(s)" in msg and "rolling it back needs" in msg, msg
    victim.stop()  # killed by its pid while its writes hang: the batch never reached it
    # Until the node is back, every call names the interrupted batch (or the cluster being down).
    with pytest.raises(ValueError, match=r"rolling it back|CLUSTERDOWN|cannot connect|connection"):
        t.find(keys)
    victim.restart()  # its append-only file gives it back its rows
    c.wait_ok()
    # The first call completes the rollback: every row, slot and count as before the batch.
    assert_same_rows(rows(t), reference)
    v, e = t.find(keys)
    assert e.all()
    np.testing.assert_array_equal(v, reference["values"][np.argsort(np.argsort(keys))])
    # And the table works again, like an in-memory table given the same calls.
    for x in (t, mem):
        x.apply_gradients(keys, np.ones((300, 3), np.float32), lr=0.5, step=2)
    assert_same_rows(t, mem)


def test_a_paused_node_that_comes_back_cannot_replay_a_rolled_back_batch(own_cluster):
    c = own_cluster
    name = fresh_name("pause")
    t = table(c.addresses, dim=2, name=name, redis={"storage_slice": 3})
    keys = np.arange(200, dtype=np.int64)
    vals = np.arange(400, dtype=np.float32).reshape(200, 2)
    t.insert_or_assign(keys, vals)
    meta_node = c.node_of(f"de:{{{name}/test/0}}:meta")
    victim = next(n for n, r in zip(c.nodes, rows_per_master(c, name)) if n is not meta_node and r)
    victim.cli("CLIENT", "PAUSE", "2500", "WRITE")  # ends by itself: queued writes then run
    with pytest.raises(ValueError, match="failed on slice"):
        t.insert_or_assign(keys, np.zeros((200, 2), np.float32))
    time.sleep(3)  # the pause is over: the node runs whatever of the batch it had queued
    # Whatever that was, the first call completes the rollback: the table reads as before.
    v, e = t.find(keys)
    assert e.all()
    np.testing.assert_array_equal(v, vals)
    t.accum(keys[:10], np.ones((10, 2), np.float32), np.ones(10, bool))
    expected = vals.copy()
    expected[:10] += 1
    np.testing.assert_array_equal(t.find(keys)[0], expected)
    assert t.size() == 200


def test_tables_written_before_the_spread_layout_still_read(cluster):
    # A table written by an older dualemb: every slice in meta's slot (de:{id}:b<i>) and no
    # storage_slice in meta. Made here with today's standalone layout, which is that one, and
    # moved into the cluster with MIGRATE.
    s = RedisServer()
    try:
        name = fresh_name("old")
        old = table([s.address], mode="standalone", name=name, dim=2, redis={"storage_slice": 3})
        keys = np.arange(50, dtype=np.int64) * 101
        vals = np.arange(100, dtype=np.float32).reshape(50, 2)
        old.insert_or_assign(keys, vals)
        ident = f"de:{{{name}/test/0}}"
        s.cli("HDEL", f"{ident}:meta", "storage_slice")
        target = cluster.node_of(f"{ident}:meta")
        out = s.cli("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS",
                    f"{ident}:meta", f"{ident}:b0", f"{ident}:b1", f"{ident}:b2")
        assert out == "OK", out
    finally:
        s.cleanup()
    with pytest.raises(ValueError, match="written with more than storage_slice 2"):
        table(cluster.addresses, name=name, dim=2, redis={"storage_slice": 2})
    t = table(cluster.addresses, name=name, dim=2, redis={"storage_slice": 3})
    v, e = t.find(keys)
    assert e.all() and t.size() == 50
    np.testing.assert_array_equal(v, vals)
    t.insert_or_assign(keys[:5], np.zeros((5, 2), np.float32))
    assert t.size() == 50
    with pytest.raises(ValueError, match="exists with storage_slice 3"):
        table(cluster.addresses, name=name, dim=2, redis={"storage_slice": 4})
