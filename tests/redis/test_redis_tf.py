"""TFRA's RedisTableCreator on dualemb.tf: config file lookup and checks, shards with disjoint
keys, and a table written through TF read back by another process through dualemb.core."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import dualemb.tf as de  # noqa: E402
from redis_server import running_server  # noqa: E402


server = pytest.fixture(scope="module")(running_server)


def write_config(tmp_path, params, name="redis.json"):
    path = tmp_path / name
    path.write_text(json.dumps(params))
    return str(path)


def test_host_and_port_only_config_with_two_shards(server, tmp_path, monkeypatch):
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH", raising=False)
    path = write_config(tmp_path, {"redis_host_ip": ["127.0.0.1"],
                                   "redis_host_port": [server.port]})
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=path))
    var = de.get_variable("redis_tf_emb", dim=3, devices=["/CPU:0", "/CPU:0"],
                          initializer=tf.keras.initializers.Zeros(), kv_creator=creator)
    keys = tf.constant(np.arange(100, dtype=np.int64))
    vals = tf.constant(np.arange(300, dtype=np.float32).reshape(100, 3))
    var.upsert(keys, vals)
    assert int(var.size()) == 100  # TFRA counts each key once per shard: 200
    np.testing.assert_array_equal(var.lookup(keys).numpy(), vals.numpy())
    # Another process reads shard tables through the core API: the union is every key once.
    code = (
        "import numpy as np\n"
        "from dualemb.core import Table\n"
        "seen = []\n"
        "for s in (0, 1):\n"
        f"    t = Table(dim=3, backend={{'redis': {{'name': 'redis_tf_emb', 'shard': s, "
        f"'addresses': ['{server.address}']}}}})\n"
        "    out = t.export(); seen += out['keys'].tolist()\n"
        "    assert np.array_equal(out['values'][:, 0], out['keys'] * 3.0)\n"
        "print(sorted(seen) == list(range(100)), len(seen))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "100"]


def test_config_lookup_order_and_missing_file(server, tmp_path, monkeypatch):
    good = write_config(tmp_path, {"redis_host_port": [server.port]}, "good.json")
    bad = write_config(tmp_path, {"redis_host_port": [1]}, "bad.json")
    monkeypatch.setenv("MY_MODEL_REDIS", good)
    monkeypatch.setenv("TFRA_REDIS_CONFIG_PATH", bad)
    cfg = de.RedisTableConfig(redis_config_abs_dir=bad, redis_config_abs_dir_env="MY_MODEL_REDIS")
    de.get_variable("lookup_order", dim=2, kv_creator=de.RedisTableCreator(cfg))  # uses good
    monkeypatch.delenv("MY_MODEL_REDIS")
    with pytest.raises(ValueError, match="cannot connect to redis at 127.0.0.1:1"):
        de.get_variable("lookup_order2", dim=2, kv_creator=de.RedisTableCreator(cfg))
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH")
    missing = de.RedisTableConfig(redis_config_abs_dir=str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="no Redis config file found.*nope.json"):
        de.get_variable("lookup_order3", dim=2, kv_creator=de.RedisTableCreator(missing))


@pytest.mark.parametrize("params, member", [
    ({"redis_hostname": "x"}, "redis_hostname"),
    ({"redis_db": "0"}, "redis_db"),
    ({"redis_connection_mode": 5}, "redis_connection_mode"),
    ({"redis_host_port": [1, 2], "redis_host_ip": ["a", "b", "c"]}, "redis_host_port"),
])
def test_wrong_members_are_named(tmp_path, monkeypatch, params, member):
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH", raising=False)
    path = write_config(tmp_path, params)
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=path))
    with pytest.raises(ValueError, match=member):
        de.get_variable(f"wrong_{member}", dim=2, kv_creator=creator)


def test_accum_on_redis_matches_numpy(server, tmp_path, monkeypatch):
    # Redis tables take the storage layer's default accum_rows (deltas computed, then accum).
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH", raising=False)
    path = write_config(tmp_path, {"redis_host_ip": ["127.0.0.1"],
                                   "redis_host_port": [server.port]})
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=path))
    var = de.get_variable("redis_tf_accum", dim=2, initializer=tf.keras.initializers.Zeros(),
                          kv_creator=creator)
    var.upsert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    keys = tf.constant([1, 2, 3, 4], tf.int64)
    old = tf.constant([[0.5, 0.5], [9.0, 9.0], [0.0, 0.0], [7.0, 7.0]])
    new = tf.constant([[2.0, 3.0], [1.0, 1.0], [5.0, 6.0], [8.0, 8.0]])
    exists = tf.constant([True, False, False, True])
    var.accum(keys, old, new, exists)
    # present & exists: += new - old; present & !exists: ignored; absent & !exists: new;
    # absent & exists: ignored.
    want = {1: [2.5, 4.5], 2: [3.0, 4.0], 3: [5.0, 6.0]}
    got_keys, got_rows = var.export()
    got = dict(zip(got_keys.numpy().tolist(), got_rows.numpy().tolist()))
    assert got == want
