"""Value dtypes through dualemb.tf: every (key, value) dtype pair TFRA's CPU tables accept, checked
operation by operation (lookup, upsert, accum, remove, export, size, TF checkpoint, de.save/load)
eagerly and in tf.function against a dict / numpy reference with exact values; float16/bfloat16
training against the core Table trained by the same fused optimizer on the same float32
gradients; integer tables refused for training with a clear error; refusals leave the table
unchanged; tables of any dtype shared by id with dualemb.core; TFRA int32 files migrated."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import Table, checkpoint
from dualemb.tf import migrate, ops

NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
      "bfloat16": np.dtype(ml_dtypes.bfloat16), "float64": np.dtype(np.float64),
      "int8": np.dtype(np.int8), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64)}
PAIRS = ([("int64", v) for v in ("float32", "float16", "bfloat16", "float64", "int32", "int8",
                                 "int64")] +
         [("int32", v) for v in ("float32", "int32", "float64", "bfloat16")])
DIM = 3


def random_rows(vd, n, rng):
    """Rows spanning the dtype (int64 beyond 2**53 so a trip through a double would show)."""
    dt = NP[vd]
    if dt.kind == "i":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, (n, DIM), dtype=dt, endpoint=True)
    return (rng.normal(size=(n, DIM)) * 10.0 ** rng.integers(-3, 3, (n, DIM))).astype(dt)


def bits(a):
    """Exact comparison key: the raw bytes of each element."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(a.shape[:-1] + (-1,)) if a.ndim else a.tobytes()


def assert_exact(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    np.testing.assert_array_equal(bits(got), bits(want))


def contents(var):
    keys, values = var.export()
    assert values.dtype == var.value_dtype
    return {int(k): v.tobytes() for k, v in zip(keys.numpy(), values.numpy())}


def run(fn, graph, *args):
    return tf.function(fn)(*args) if graph else fn(*args)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("key_dtype,value_dtype", PAIRS)
def test_dtype_matrix_operations(key_dtype, value_dtype, graph):
    rng = np.random.default_rng(abs(hash((key_dtype, value_dtype))) % 2**32)
    dt, kd, vd = NP[value_dtype], tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
    init = 3 if dt.kind == "i" else 0.5
    var = de.Variable(key_dtype=kd, value_dtype=vd, dim=DIM, initializer=init,
                      devices=["/CPU:0"] * 2, name=f"m_{key_dtype}_{value_dtype}_{graph}")
    keys = rng.choice(1 << 20, 40, replace=False).astype(key_dtype) - (1 << 19)
    rows = random_rows(value_dtype, 40, rng)
    ref = {int(k): r for k, r in zip(keys, rows)}

    run(var.upsert, graph, tf.constant(keys), tf.constant(rows, vd))
    probe = np.concatenate([keys[:5], np.array([1 << 21], key_dtype)])
    got, exists = run(lambda k: var.lookup(k, return_exists=True), graph, tf.constant(probe))
    assert got.dtype == vd
    assert_exact(got.numpy(), np.stack([ref[int(k)] for k in probe[:5]]
                                       + [np.full(DIM, init, dt)]))
    assert exists.numpy().tolist() == [True] * 5 + [False]
    assert int(run(var.size, graph)) == 40

    # accum (TFRA's rule): present & exists -> += new - old (in the value dtype; integers wrap);
    # absent & !exists -> insert new; present & !exists, absent & exists -> ignored.
    new_key = np.array([1 << 21, (1 << 21) + 1], key_dtype)
    acc_keys = np.concatenate([keys[:3], new_key])
    old = np.stack([ref[int(k)] for k in keys[:3]] + [np.zeros(DIM, dt)] * 2)
    new = random_rows(value_dtype, 5, rng)
    flags = np.array([True, True, False, False, True])
    run(var.accum, graph, tf.constant(acc_keys), tf.constant(old, vd), tf.constant(new, vd),
        tf.constant(flags))
    with np.errstate(over="ignore"):
        for i in range(2):  # present & exists: row + (new - old), with old == row
            k = int(acc_keys[i])
            delta = (new[i] - old[i]).astype(dt)
            ref[k] = ((ref[k] + delta).astype(dt) if dt.kind == "i" or dt.itemsize >= 4
                      else (ref[k].astype(np.float32) + delta.astype(np.float32)).astype(dt))
    ref[int(acc_keys[3])] = new[3]  # absent & !exists: inserted
    # acc_keys[2] present & !exists, acc_keys[4] absent & exists: ignored

    run(lambda k: [var.remove(k)][:0], graph, tf.constant(keys[30:]))
    for k in keys[30:]:
        del ref[int(k)]
    exp_keys, exp_values = run(var.export, graph)
    assert exp_values.dtype == vd
    got_ref = {int(k): v for k, v in zip(exp_keys.numpy(), exp_values.numpy())}
    assert set(got_ref) == set(ref)
    for k, v in ref.items():
        assert_exact(got_ref[k], v)


@pytest.mark.parametrize("key_dtype,value_dtype", PAIRS)
def test_checkpoint_round_trips_every_pair(tmp_path, key_dtype, value_dtype):
    rng = np.random.default_rng(7)
    kd, vd = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
    var = de.Variable(key_dtype=kd, value_dtype=vd, dim=DIM, devices=["/CPU:0"] * 2,
                      name=f"ck_{key_dtype}_{value_dtype}")
    keys = np.arange(-20, 20, dtype=key_dtype) * 977
    var.upsert(tf.constant(keys), tf.constant(random_rows(value_dtype, 40, rng), vd))
    saved = contents(var)

    # tf.train.Checkpoint: values saved in the value dtype (an int64 row stays exact).
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "tf" / "ckpt"))
    assert dict(tf.train.list_variables(path))["emb/.ATTRIBUTES/values"] == [40, DIM]
    var.remove(tf.constant(keys[:10]))
    var.upsert(tf.constant(keys[10:12]), tf.zeros([2, DIM], vd))
    tf.train.Checkpoint(emb=var).restore(path)
    assert contents(var) == saved

    # The common format (de.save / de.load), into a fresh Variable of one shard.
    de.save(var, str(tmp_path / "common"))
    other = de.Variable(key_dtype=kd, value_dtype=vd, dim=DIM, name=var.name)
    de.load(other, str(tmp_path / "common"))
    assert contents(other) == saved


def test_core_common_format_int32_restores_exactly(tmp_path):
    """A checkpoint written by dualemb.core.Table(value_dtype="int32") loads into an int32
    de.Variable exactly, and an int32 core table attaches to the TF ops by id."""
    t = Table(dim=DIM, value_dtype="int32", name="counts")
    keys = np.arange(50, dtype=np.int64) * 1_000_003
    vals = np.random.default_rng(1).integers(-2**31, 2**31 - 1, (50, DIM), dtype=np.int32)
    t.insert_or_assign(keys, vals)
    checkpoint.save(str(tmp_path / "ck"), {"counts": t})
    var = de.Variable(value_dtype=tf.int32, dim=DIM, name="counts", devices=["/CPU:0"] * 3)
    de.load(var, str(tmp_path / "ck"))
    assert_exact(var.lookup(tf.constant(keys)).numpy(), vals)

    handle = ops.attach_table(t.id)
    assert_exact(ops.find(handle, tf.constant(keys[:4]), DIM, tf.int32)[0].numpy(), vals[:4])
    del handle
    t.destroy()


def test_tfra_int32_files_migrate_into_int32_variable(tmp_path):
    """TFRA's FileSystemSaver files of an int32-valued table (raw keys and values) migrate
    exactly into an int32 de.Variable."""
    keys = np.arange(30, dtype=np.int64) * 7 - 100
    vals = np.random.default_rng(2).integers(-2**31, 2**31 - 1, (30, DIM), dtype=np.int32)
    (tmp_path / "counts_mht_1of1_rank0_size1-keys").write_bytes(keys.tobytes())
    (tmp_path / "counts_mht_1of1_rank0_size1-values").write_bytes(vals.tobytes())
    data = migrate.read_tfra_file_system(str(tmp_path), dim=DIM, value_dtype="int32")
    var = de.Variable(value_dtype=tf.int32, dim=DIM, name="counts_tfra", devices=["/CPU:0"] * 2)
    migrate.load_tfra_into(var, data, name="counts")
    assert int(var.size()) == 30
    assert_exact(var.lookup(tf.constant(keys)).numpy(), vals)


def test_half_dtypes_store_two_bytes_per_element():
    n, dim = 100_000, 64  # large enough that row chunks, not their granularity, dominate
    keys = tf.range(n, dtype=tf.int64)
    mem = {}
    for vd in (tf.float32, tf.float16, tf.bfloat16):
        var = de.Variable(value_dtype=vd, dim=dim, name=f"mem_{vd.name}")
        var.upsert(keys, tf.ones([n, dim], vd))
        mem[vd.name] = Table.attach(var.tables[0].table_id).memory_bytes()
    # The rows shrink by 2 bytes per element; the index and metadata stay as they are.
    for half in ("float16", "bfloat16"):
        saved = mem["float32"] - mem[half]
        assert saved >= 0.9 * n * dim * 2, mem


def _train_reference(var, keys_per_step, grads_per_step, lr):
    """The core Table with the Variable's initializer and fused optimizer, trained on the
    same float32 gradients."""
    ref = Table(dim=var.dim, value_dtype=var.value_dtype.name, initializer=var.initializer_spec,
                optimizer=var.optimizer_spec)
    for step, (k, g) in enumerate(zip(keys_per_step, grads_per_step), start=1):
        ref.apply_gradients(k, g, lr, step)
    return ref


@pytest.mark.parametrize("value_dtype", [tf.float16, tf.bfloat16])
def test_half_variable_trains_like_the_core_reference(value_dtype):
    var = de.Variable(value_dtype=value_dtype, dim=4, name=f"train_{value_dtype.name}",
                      initializer=tf.keras.initializers.RandomNormal(seed=3))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
    w = tf.constant(np.random.default_rng(0).normal(size=(4,)).astype(np.float32))
    batches = [np.array([1, 2, 2, 9], np.int64), np.array([2, 5], np.int64),
               np.array([9, 1, 7], np.int64)]
    seen_keys, seen_grads = [], []

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
            assert rows.dtype == value_dtype
            loss = tf.reduce_sum(tf.square(tf.cast(rows, tf.float32) * w))
        grad = tape.gradient(loss, trainable)
        opt.apply_gradients([(grad, trainable)])
        return grad.indices, grad.values

    for ids in batches:
        k, g = step(tf.constant(ids))
        assert g.dtype == tf.float32
        seen_keys.append(k.numpy())
        seen_grads.append(g.numpy())
    ref = _train_reference(var, seen_keys, seen_grads, 0.05)
    keys = np.array([1, 2, 5, 7, 9], np.int64)
    want = ref.find(keys)[0]
    got = var.lookup(tf.constant(keys)).numpy()
    assert_exact(got, want)
    # And the rows moved (the optimizer ran).
    assert not np.array_equal(bits(got), bits(ref.initial_values(keys)))
    ref.destroy()


@pytest.mark.parametrize("value_dtype", [tf.float16, tf.bfloat16])
def test_keras_layer_with_half_values_fits(value_dtype):
    keras = tf.keras
    emb = de.keras.layers.Embedding(4, value_dtype=value_dtype, name=f"fit_{value_dtype.name}",
                                    initializer=0.1)
    ids = keras.Input((2,), dtype="int64")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(emb(ids)))
    model = keras.Model(ids, out)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), "mse")
    x = np.array([[1, 2], [3, 4]], np.int64)
    before = emb.params.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    model.fit(x, np.ones((2, 1), np.float32), epochs=2, verbose=0)
    after = emb.params.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    assert after.dtype == NP[value_dtype.name]
    assert not np.array_equal(bits(before), bits(after))
    assert int(emb.params.size()) == 4


@pytest.mark.parametrize("value_dtype", [tf.int32, tf.int8, tf.int64, tf.float64])
def test_untrainable_dtypes_refuse_training_clearly(value_dtype):
    var = de.Variable(value_dtype=value_dtype, dim=2, name=f"notrain_{value_dtype.name}")
    var.upsert(tf.constant([1], tf.int64), tf.ones([1, 2], value_dtype))
    before = contents(var)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    rows, trainable = de.embedding_lookup(var, tf.constant([1, 2], tf.int64),
                                          return_trainable=True)
    grad = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 2], tf.int64))
    with pytest.raises(TypeError, match=f"value_dtype {value_dtype.name}, which cannot be trained"):
        opt.apply_gradients([(grad, trainable)])
    assert contents(var) == before
    # A trainable Keras layer says so when it is built.
    layer = de.keras.layers.Embedding(2, value_dtype=value_dtype, initializer=0,
                                      name=f"notrain_layer_{value_dtype.name}")
    with pytest.raises(TypeError, match=value_dtype.name):
        layer(tf.constant([[1]], tf.int64))
    # Not trainable: lookups work.
    frozen = de.keras.layers.Embedding(2, value_dtype=value_dtype, initializer=0, trainable=False,
                                       name=f"frozen_{value_dtype.name}")
    assert frozen(tf.constant([[1]], tf.int64)).dtype == value_dtype


def test_integer_variable_refusals_leave_it_unchanged():
    with pytest.raises(ValueError, match="value_dtype int32"):
        de.Variable(value_dtype=tf.int32, dim=2, name="rand_int",
                    initializer=tf.keras.initializers.RandomNormal())
    var = de.Variable(value_dtype=tf.int32, dim=2, name="refuse_int", initializer=7)
    var.upsert(tf.constant([1, 2], tf.int64), tf.constant([[1, 2], [3, 4]], tf.int32))
    before = contents(var)
    with pytest.raises(TypeError, match="int32"):
        var.upsert(tf.constant([3], tf.int64), tf.constant([[1.0, 2.0]]))  # float32 rows
    with pytest.raises(TypeError, match="int32"):
        var.upsert(tf.constant([3], tf.int64), np.array([[1, 2]], np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="value dtype is int32"):
        ops.insert_or_assign(var.tables[0].resource, tf.constant([3], tf.int64),
                             tf.constant([[1.0, 2.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="value dtype is int32"):
        ops.export_table(var.tables[0].resource, tf.int64, 2)  # float32 export of int32 rows
    with pytest.raises(TypeError, match="combiner='sum'"):
        de.embedding_lookup_sparse(var, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64),
                                                        [1, 1]), None, combiner="mean")
    assert contents(var) == before
    # The integer initializer reads exactly; sum-combined sparse lookups stay integers.
    assert var.lookup(tf.constant([9], tf.int64)).numpy().tolist() == [[7, 7]]
    sp = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [1, 2])
    out = de.embedding_lookup_sparse(var, sp, None, combiner="sum")
    assert out.dtype == tf.int32 and out.numpy().tolist() == [[4, 6]]


@pytest.mark.parametrize("value_dtype", [tf.bfloat16, tf.int64])
def test_keras_weight_files_keep_the_value_dtype(tmp_path, value_dtype):
    keras = tf.keras
    emb = de.keras.layers.Embedding(3, value_dtype=value_dtype, initializer=1,
                                    trainable=value_dtype.is_floating, name=f"w_{value_dtype.name}")
    ids = keras.Input((2,), dtype="int64")
    model = keras.Model(ids, emb(ids))
    keys = tf.constant([1, 2, 3], tf.int64)
    big = 2**40 + 1 if value_dtype == tf.int64 else 9  # not representable in a float32
    rows = np.array([[1, 2, 3], [4, 5, 6], [7, 8, big]]).astype(NP[value_dtype.name])
    emb.params.upsert(keys, tf.constant(rows))
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    emb.params.clear()
    model.load_weights(path)
    assert_exact(emb.params.lookup(keys).numpy(), rows)


# Defaults that float32 cannot hold: 2**24 + 1 (int32), 2**40 + 1 (int64), 0.1 (float64). Each
# must reach the table as given, whatever form the initializer takes.
EXACT_DEFAULTS = [
    ("int32", [2**24 + 1, -(2**31), 2**31 - 1]),
    ("int64", [2**40 + 1, -(2**52) - 3, 7]),
    ("float64", [0.1, 1.0 / 3.0, -2.0**-30]),
]


@pytest.mark.parametrize("value_dtype,row", EXACT_DEFAULTS)
@pytest.mark.parametrize("form", ["list", "numpy", "tensor", "callable", "constant"])
def test_initializer_values_reach_the_table_exactly(value_dtype, row, form):
    """A default row is never rounded through float32 on its way to the core (it was: an int32
    table given [2**24 + 1, ...] read 16777216)."""
    want = np.array(row, NP[value_dtype])
    init = {"list": row, "numpy": want, "tensor": tf.constant(want),
            "callable": lambda: want, "constant": row[0]}[form]
    v = de.Variable(dim=DIM, value_dtype=getattr(tf, value_dtype), initializer=init,
                    name=f"exact_{value_dtype}_{form}")
    got = v.lookup(tf.constant([5, 2**40], tf.int64)).numpy()
    expect = np.broadcast_to(want if form != "constant" else want[:1], (2, DIM))
    np.testing.assert_array_equal(bits(got), bits(expect.astype(NP[value_dtype])))
    core_init = want if form in ("tensor", "callable") else init
    same = Table(dim=DIM, value_dtype=value_dtype, initializer=core_init)
    np.testing.assert_array_equal(bits(same.find(np.array([5], np.int64))[0][0]),
                                  bits(expect[0].astype(NP[value_dtype])))


def test_int64_beyond_2_53_exact_as_integers_refused_as_floats():
    """int64 defaults beyond 2^53 (a double's integer range) are kept exactly when given as
    integers, as a constant or a vector; given as floats, they may already be rounded, so they
    are refused, never stored possibly wrong."""
    big = 2**60 + 1
    v = de.Variable(dim=2, value_dtype=tf.int64, initializer=big, name="exact_big_constant")
    np.testing.assert_array_equal(v.lookup(tf.constant([1], tf.int64)).numpy(), [[big, big]])
    row = np.array([big, -(2**62) - 5], np.int64)
    for init in (row.tolist(), row, tf.constant(row)):
        v = de.Variable(dim=2, value_dtype=tf.int64, initializer=init, name="exact_big_vector")
        np.testing.assert_array_equal(v.lookup(tf.constant([1], tf.int64)).numpy(), [row])
    np.testing.assert_array_equal(
        Table(dim=2, value_dtype="int64", initializer=row).find(np.array([9]))[0], [row])
    with pytest.raises(ValueError, match="2\\^53"):
        de.Variable(dim=2, value_dtype=tf.int64, initializer=[2.0**60, 3.0], name="exact_float")
