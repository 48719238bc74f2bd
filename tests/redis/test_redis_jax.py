"""A Redis-backed table is shared across frameworks: rows written through dualemb.tf are read by
dualemb.jax from the same Redis table (and the other way), compared with the values written."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
jax = pytest.importorskip("jax")
import dualemb.jax as dej  # noqa: E402
import dualemb.tf as de  # noqa: E402
from redis_server import running_server  # noqa: E402


server = pytest.fixture(scope="module")(running_server)


def test_table_written_by_tf_is_read_and_trained_by_jax(server, tmp_path, monkeypatch):
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH", raising=False)
    path = tmp_path / "redis.json"
    path.write_text(json.dumps({"redis_host_ip": ["127.0.0.1"], "redis_host_port": [server.port]}))
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=str(path)))
    var = de.Variable(dim=4, name="xfw_emb", kv_creator=creator)
    keys = np.array([3, 2**40, -7], np.int64)
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    var.upsert(keys, rows)

    backend = {"redis": {"name": "xfw_emb", "shard": 0, "addresses": [server.address]}}
    table = dej.create(4, backend=backend, optimizer=dej.optimizers.sgd(0.5))
    np.testing.assert_array_equal(np.asarray(dej.lookup(table, dej.ids(keys))), rows)
    grads = np.ones((3, 4), np.float32)
    table = jax.jit(dej.apply_gradients)(table, dej.ids(keys), grads)
    dej.block(table)
    # TF sees JAX's SGD step (rows - 0.5 * grad) in the same Redis table.
    np.testing.assert_array_equal(var.lookup(keys).numpy(), rows - 0.5)


def test_generic_optax_path_is_refused_on_redis(server):
    optax = pytest.importorskip("optax")
    backend = {"redis": {"name": "xfw_generic", "addresses": [server.address]}}
    with pytest.raises(ValueError, match="generic Optax path"):
        dej.create(4, backend=backend, optimizer=optax.adam(0.1))
