"""dualemb.tf.Variable: TFRA's API and semantics (lookups, writes, sharding, initializers,
restrict policies, creators, slots)."""

import inspect
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import initializers as core_inits
from dualemb.core import Table
from dualemb.tf import initializers as de_inits
from dualemb.tf import ops
from sum_loss_training import train_sum_loss

_counter = [0]


def _name(prefix="var"):
    _counter[0] += 1
    return f"{prefix}_{_counter[0]}"


def _var(**kw):
    kw.setdefault("name", _name())
    return de.Variable(**kw)


def test_signature_matches_tfra():
    params = inspect.signature(de.Variable.__init__).parameters
    expected = [("key_dtype", tf.int64), ("value_dtype", tf.float32), ("dim", 1),
                ("devices", None), ("partitioner", de.default_partition_fn),
                ("shared_name", None), ("name", "DynamicEmbedding_Variable"),
                ("initializer", None), ("trainable", True), ("checkpoint", True),
                ("init_size", 0), ("kv_creator", None), ("restrict_policy", None),
                ("bp_v2", False)]
    for name, default in expected:
        assert params[name].default == default, name
    gparams = inspect.signature(de.get_variable).parameters
    assert list(gparams)[0] == "name" and gparams["shared_name"].default == "get_variable"


def test_lookup_upsert_remove_clear_export():
    v = _var(dim=3, initializer=-1.0)
    keys = tf.constant([[1, 2], [3, 4]], tf.int64)
    values, exists = v.lookup(keys, return_exists=True)
    assert values.shape == (2, 2, 3) and exists.shape == (2, 2)
    np.testing.assert_array_equal(values.numpy(), -np.ones((2, 2, 3)))
    assert int(v.size()) == 0  # lookups never insert
    v.upsert(keys, tf.reshape(tf.range(12, dtype=tf.float32), [2, 2, 3]))
    assert int(v.size()) == 4
    np.testing.assert_array_equal(v.lookup([3]).numpy(), [[6, 7, 8]])
    k, vals = v.export()
    order = np.argsort(k.numpy())
    np.testing.assert_array_equal(k.numpy()[order], [1, 2, 3, 4])
    np.testing.assert_array_equal(vals.numpy()[order], np.arange(12).reshape(4, 3))
    v.remove(tf.constant([1, 99], tf.int64))
    assert int(v.size()) == 3
    v.clear()
    assert int(v.size()) == 0


def test_accum_follows_tfra_rule():
    v = _var(dim=2)
    v.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    old = tf.constant([[1.0, 1.0], [0.0, 0.0], [5.0, 5.0], [9.0, 9.0]])
    new = tf.constant([[4.0, 4.0], [7.0, 7.0], [6.0, 6.0], [3.0, 3.0]])
    # key 1 present & exists: += new - old; key 3 absent & !exists: insert new;
    # key 4 absent & exists: ignored; key 2 present & !exists: ignored.
    v.accum(tf.constant([1, 3, 4, 2], tf.int64), old, new,
            tf.constant([True, False, True, False]))
    values, exists = v.lookup(tf.constant([1, 2, 3, 4], tf.int64), return_exists=True)
    np.testing.assert_array_equal(values.numpy()[:3], [[4, 4], [2, 2], [7, 7]])
    np.testing.assert_array_equal(exists.numpy(), [True, True, True, False])


def test_sharding_routes_keys_by_floored_mod():
    v = _var(dim=1, devices=["/CPU:0"] * 3)
    keys = np.array([-7, -1, 0, 1, 2, 3, 4, 5, 10, 2**40 + 1], np.int64)
    v.upsert(keys, keys[:, None].astype(np.float32))
    counts = [int(v.size(i)) for i in range(3)]
    assert counts == [int(np.sum(np.mod(keys, 3) == i)) for i in range(3)]
    assert int(v.size()) == len(keys)
    np.testing.assert_array_equal(v.lookup(keys).numpy()[:, 0], keys.astype(np.float32))
    for i, shard in enumerate(v.tables):
        page_keys = Table.attach(shard.table_id).export()["keys"]
        assert np.all(np.mod(page_keys, 3) == i)
    with pytest.raises(IndexError):
        v.size(3)


def test_custom_partitioner():
    v = _var(dim=1, devices=["/CPU:0", "/CPU:0"], partitioner=lambda k, n: tf.cast(k >= 100, tf.int32))
    v.upsert([1, 2, 150], [[1.0], [2.0], [3.0]])
    assert [int(v.size(0)), int(v.size(1))] == [2, 1]


def test_variable_methods_inside_tf_function():
    v = _var(dim=2, devices=["/CPU:0"] * 2)

    @tf.function
    def step(keys, values):
        v.upsert(keys, values)
        return v.lookup(keys), v.size()

    rows, size = step(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    np.testing.assert_array_equal(rows.numpy(), np.ones((3, 2)))
    assert int(size) == 3


def test_int32_keys_and_half_values():
    v = _var(key_dtype=tf.int32, value_dtype=tf.float16, dim=2, initializer=0.5)
    out = v.lookup(tf.constant([1, 2], tf.int32))
    assert out.dtype == tf.float16
    np.testing.assert_array_equal(out.numpy(), np.full((2, 2), 0.5, np.float16))
    v.upsert(tf.constant([1], tf.int32), tf.constant([[2.0, 3.0]], tf.float16))
    np.testing.assert_array_equal(v.lookup(tf.constant([1], tf.int32)).numpy(), [[2, 3]])


@pytest.mark.parametrize("initializer, expected", [
    (None, core_inits.zeros()),
    (0.25, core_inits.constant(0.25)),
    (np.array([1.0, 2.0, 3.0]), core_inits.vector([1.0, 2.0, 3.0])),
    (np.array([-1.0]), core_inits.constant(-1.0)),          # length 1: broadcast
    ([7.0, 8.0], core_inits.constant(7.0)),                 # other length: first element
    (keras.initializers.Zeros(), core_inits.zeros()),
    (keras.initializers.Ones(), core_inits.constant(1.0)),
    (keras.initializers.Constant(3.0), core_inits.constant(3.0)),
    (keras.initializers.RandomNormal(0.1, 0.2, seed=4), core_inits.normal(0.1, 0.2, 4)),
    (keras.initializers.TruncatedNormal(0.0, 0.3, seed=5),
     core_inits.truncated_normal(0.0, 0.3, 5)),
    (keras.initializers.RandomUniform(-0.2, 0.4, seed=6), core_inits.uniform(-0.2, 0.4, 6)),
    (tf.random_normal_initializer(0.0, 2.0, seed=7), core_inits.normal(0.0, 2.0, 7)),
    (tf.random_uniform_initializer(0.0, 1.0, seed=8), core_inits.uniform(0.0, 1.0, 8)),
    (tf.zeros_initializer(), core_inits.zeros()),
    (tf.ones_initializer(), core_inits.constant(1.0)),
    (tf.constant_initializer(2.0), core_inits.constant(2.0)),
    ("zeros", core_inits.zeros()),
    # TF1 initializers that still ship with TF 2.21 (TFRA accepts them).
    (tf.compat.v1.random_normal_initializer(0.5, 0.1, seed=3), core_inits.normal(0.5, 0.1, 3)),
    (tf.compat.v1.truncated_normal_initializer(0.0, 0.2, seed=9),
     core_inits.truncated_normal(0.0, 0.2, 9)),
    (tf.compat.v1.random_uniform_initializer(-0.3, 0.3, seed=1), core_inits.uniform(-0.3, 0.3, 1)),
    (tf.compat.v1.random_uniform_initializer(seed=2), core_inits.uniform(0.0, 1.0, 2)),  # TF1 default
    (tf.compat.v1.constant_initializer(4.0), core_inits.constant(4.0)),
    (tf.compat.v1.constant_initializer([1.0, 2.0, 3.0]), core_inits.vector([1.0, 2.0, 3.0])),
    (tf.compat.v1.zeros_initializer(), core_inits.zeros()),
    (tf.compat.v1.ones_initializer(), core_inits.constant(1.0)),
])
def test_initializer_mapping(initializer, expected):
    assert de_inits.to_spec(initializer, 3, "x") == expected


def test_initializer_rows_are_deterministic_per_key():
    init = keras.initializers.RandomNormal(0.0, 1.0, seed=11)
    a = _var(dim=8, initializer=init)
    b = _var(dim=8, initializer=init, devices=["/CPU:0"] * 4)
    keys = np.arange(-50, 50, dtype=np.int64)
    np.testing.assert_array_equal(a.lookup(keys).numpy(), b.lookup(keys).numpy())
    table = Table(dim=8, initializer=core_inits.normal(0.0, 1.0, 11))
    np.testing.assert_array_equal(a.lookup(keys).numpy(), table.find(keys)[0])
    big = a.lookup(np.arange(20000, dtype=np.int64)).numpy()
    assert abs(big.mean()) < 0.02 and abs(big.std() - 1.0) < 0.02


def test_seed_none_derives_from_the_name():
    init = keras.initializers.RandomUniform(-1.0, 1.0)  # seed None
    a = de.Variable(dim=4, initializer=init, name="seedless_a")
    a2 = de.Variable(dim=4, initializer=init, name="seedless_a")
    b = de.Variable(dim=4, initializer=init, name="seedless_b")
    keys = np.arange(10, dtype=np.int64)
    np.testing.assert_array_equal(a.lookup(keys).numpy(), a2.lookup(keys).numpy())
    assert not np.allclose(a.lookup(keys).numpy(), b.lookup(keys).numpy())
    assert a.initializer_spec["seed"] == de_inits.name_seed("seedless_a")
    rows = a.lookup(np.arange(5000, dtype=np.int64)).numpy()
    assert rows.min() >= -1.0 and rows.max() <= 1.0


def test_truncated_normal_is_bounded():
    v = _var(dim=16, initializer=keras.initializers.TruncatedNormal(0.0, 0.5, seed=2))
    rows = v.lookup(np.arange(5000, dtype=np.int64)).numpy()
    assert np.abs(rows).max() <= 1.0 + 1e-6


@pytest.mark.parametrize("bad", [keras.initializers.Orthogonal(), keras.initializers.Identity(),
                                 "orthogonal", object()])
def test_unsupported_initializer_is_a_clear_error(bad):
    with pytest.raises(TypeError, match="supported"):
        _var(dim=2, initializer=bad)


@pytest.mark.parametrize("make", [
    lambda s: keras.initializers.GlorotUniform(seed=s),
    lambda s: keras.initializers.HeNormal(seed=s),
    lambda s: keras.initializers.LecunUniform(seed=s),
    lambda s: keras.initializers.VarianceScaling(3.0, "fan_out", "untruncated_normal", seed=s),
    lambda s: keras.initializers.VarianceScaling(0.5, "fan_avg", "truncated_normal", seed=s),
])
def test_variance_scaling_rows_follow_keras_for_one_key(make):
    """TFRA draws an initializer with the shape [keys in the lookup, dim]; a key looked up alone
    gets Keras' distribution for [1, dim]. Compared with Keras itself drawing that shape under
    many seeds: same spread, same bound."""
    dim = 8
    v = _var(dim=dim, initializer=make(5))
    ours = v.lookup(np.arange(16000, dtype=np.int64)).numpy()
    keras_rows = np.concatenate([np.asarray(make(s)(shape=(1, dim))) for s in range(2000)])
    np.testing.assert_allclose(ours.std(), keras_rows.std(), rtol=0.04)
    assert abs(ours.mean()) < 0.05 * keras_rows.std()
    # Uniform and truncated-normal draws share a hard bound; untruncated ones share a tail.
    np.testing.assert_allclose(np.abs(ours).max(), np.abs(keras_rows).max(), rtol=0.1)
    same = _var(dim=dim, initializer=make(5))  # deterministic per key
    np.testing.assert_array_equal(same.lookup(np.arange(50, dtype=np.int64)).numpy(), ours[:50])


def test_variance_scaling_initializers_of_every_keras():
    """TF1's and tf_keras' Glorot/He initializers map as Keras 3's do."""
    import tf_keras

    want = de_inits.to_spec(keras.initializers.GlorotUniform(seed=3), 8, "x")
    assert want == core_inits.uniform(-np.sqrt(6 / 9), np.sqrt(6 / 9), 3)
    assert de_inits.to_spec(tf_keras.initializers.GlorotUniform(seed=3), 8, "x") == want
    assert de_inits.to_spec(tf.compat.v1.glorot_uniform_initializer(seed=3), 8, "x") == want
    he = core_inits.truncated_normal(0.0, np.sqrt(2.0) / .87962566103423978, 4)
    assert de_inits.to_spec(keras.initializers.HeNormal(seed=4), 8, "x") == he
    assert de_inits.to_spec(tf_keras.initializers.HeNormal(seed=4), 8, "x") == he
    assert de_inits.to_spec("glorot_uniform", 8, "x")["initializer"] == "uniform"


def test_callable_initializer_is_called_as_tfra_calls_it():
    """A callable that is not an initializer object: called once, ``init(shape=[1])`` (or
    ``init()`` when that fails), and its value is the default row (TFRA's
    ``_convert_anything_to_init``)."""
    calls = []

    def with_shape(shape):
        calls.append(shape)
        return tf.ones(shape) * 3.0

    v = _var(dim=4, initializer=with_shape)
    np.testing.assert_array_equal(v.lookup(np.array([1, 2**40], np.int64)).numpy(),
                                  np.full((2, 4), 3.0, np.float32))
    assert calls == [[1]]
    v = _var(dim=3, initializer=lambda: [0.5, -1.0, 2.0])  # no shape argument: init()
    np.testing.assert_array_equal(v.lookup(np.array([7], np.int64)).numpy(), [[0.5, -1.0, 2.0]])
    v = _var(dim=3, initializer=lambda: lambda: np.float32(-2.0))  # called while callable
    np.testing.assert_array_equal(v.lookup(np.array([7], np.int64)).numpy(), [[-2.0] * 3])
    # A class is called too, and gives an initializer object that maps per key.
    v = _var(dim=3, initializer=keras.initializers.Ones)
    np.testing.assert_array_equal(v.lookup(np.array([7], np.int64)).numpy(), [[1.0] * 3])
    # A function that returns nothing is an error, not a zeros default.
    with pytest.raises(TypeError, match="returned None"):
        _var(dim=3, initializer=lambda shape: None)


def test_get_variable_reuses_by_name():
    name = _name("gv")
    a = de.get_variable(name, dim=3)
    assert de.get_variable(name, dim=3) is a
    with pytest.raises(ValueError, match="already exists"):
        de.get_variable(name, dim=4)


def _train(var, steps, lr=0.1):
    return train_sum_loss(var, steps, keras.optimizers.SGD(lr, momentum=0.5))


def test_timestamp_policy_keeps_most_recent_with_slots():
    v = _var(dim=2, restrict_policy=de.TimestampRestrictPolicy, devices=["/CPU:0"] * 2)
    _train(v, [[1, 2, 3, 4], [3, 4], [4, 5]])
    assert int(v.size()) == 5
    assert int(v.restrict(3, trigger=10)) == 0  # below the trigger: nothing happens
    removed = v.restrict(2)
    assert int(removed) == 3
    keys, _ = v.export()
    assert sorted(keys.numpy().tolist()) == [4, 5]
    slot_keys, _ = v.get_slot_variables()[0].export()
    assert sorted(slot_keys.numpy().tolist()) == [4, 5]
    status_keys, stamps = v.restrict_policy.status.export()
    assert sorted(status_keys.numpy().tolist()) == [4, 5]
    np.testing.assert_array_equal(v.restrict_policy.status.lookup([4, 5, 1]).numpy() > 0,
                                  [True, True, False])


def test_frequency_policy_keeps_most_frequent():
    v = _var(dim=2, restrict_policy=de.FrequencyRestrictPolicy)
    _train(v, [[1, 2, 3], [1, 2], [1, 1, 1]])  # counts 3, 2, 1 (duplicates count once)
    np.testing.assert_array_equal(v.restrict_policy.status.lookup([1, 2, 3]).numpy(), [3, 2, 1])
    v.restrict(2)
    assert sorted(v.export()[0].numpy().tolist()) == [1, 2]
    with pytest.raises(ValueError):
        v.restrict(-1)


def test_restrict_policy_must_be_a_class():
    with pytest.raises(TypeError, match="class"):
        _var(dim=2, restrict_policy=de.TimestampRestrictPolicy(None))


def test_restrict_without_policy_warns():
    v = _var(dim=2)
    with pytest.warns(UserWarning, match="restrict_policy"):
        assert v.restrict(10) is None


def test_slot_variables_and_trainable_store():
    v = _var(dim=2)
    opt = _train(v, [[1, 2]], lr=1.0)
    slots = v.get_slot_variables(opt)
    assert [s.name for s in slots] == [f"{v.name}/momentum"]
    # SGD momentum 0.5, lr 1: m = 0.5*0 - 1*g = -1
    np.testing.assert_allclose(slots[0].lookup([1, 2, 3]).numpy(), [[-1, -1], [-1, -1], [0, 0]])
    assert isinstance(v.get_trainable_by_name("t"), de.TrainableWrapper)
    assert set(v.trainable_store) == {"t"}
    assert v.get_slot_variables(keras.optimizers.SGD()) == []


def test_hkv_creator_bounds_the_table():
    v = _var(dim=2, kv_creator=de.HkvHashTableCreator(
        config=de.HkvHashTableConfig(max_capacity=8, evict_strategy=de.HkvEvictStrategy.LRU)))
    v.upsert(np.arange(20, dtype=np.int64), np.zeros((20, 2), np.float32))
    assert int(v.size()) <= 8
    assert isinstance(de.CuckooHashTableCreator(config=de.CuckooHashTableConfig()), de.KVCreator)
    # Redis tables are real now (tests/redis/test_redis_tf.py); without a config file: ValueError.
    if "TFRA_REDIS_CONFIG_PATH" not in os.environ:
        with pytest.raises(ValueError, match="no Redis config file found"):
            _var(dim=2, kv_creator=de.RedisTableCreator())


def test_tables_contract():
    v = _var(dim=5, devices=["/CPU:0"] * 2)
    assert len(v.tables) == 2 and v.shard_num == 2 and v.dim == 5
    for shard in v.tables:
        assert isinstance(shard.table_id, int)
        assert shard.resource.dtype == tf.resource
        assert int(ops.table_id(shard.resource)) == shard.table_id
        assert json.loads(shard.config)["dim"] == 5
    assert v.optimizer_spec is None
    assert v.key_dtype == tf.int64 and v.value_dtype == tf.float32
    assert isinstance(v, tf.__internal__.tracking.Trackable)


def test_save_to_and_load_from_file_system(tmp_path):
    src = _var(dim=2, devices=["/CPU:0"] * 2)
    _train(src, [[1, 2, 3]])
    path = src.save_to_file_system(str(tmp_path))
    assert os.path.isdir(path)
    dst = de.Variable(dim=2, name=src.name, devices=["/CPU:0"] * 3)
    dst.upsert([99], [[5.0, 5.0]])
    dst.load_from_file_system(str(tmp_path))
    keys, values = dst.export()
    order = np.argsort(keys.numpy())
    assert keys.numpy()[order].tolist() == [1, 2, 3]  # replaced, not merged
    np.testing.assert_array_equal(values.numpy()[order], src.lookup([1, 2, 3]).numpy())
