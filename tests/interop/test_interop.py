"""TF <-> JAX interop at the bit level: initial rows, one optimizer step, checkpoints both ways with
slots and step, resharding across the exchange, and TF -> JAX -> TF continuation.

Tolerances: everything the core computes (initial rows, fused optimizer steps from the same
gradients, checkpoint contents) is compared bit for bit; the dense Keras-Adam update of
``dualemb.interop.keras_adam`` too. Model outputs and losses computed by TF and by XLA differ by
float32 rounding (their matmul kernels sum in different orders): held-out predictions at a
hand-off must agree within 1e-5 (measured ~5e-8), and over a short TF -> JAX -> TF continuation
(3 legs x 6 steps) every loss must be within LOSS_TOL = 2e-6 of the run that stayed in TF
(measured: at most 6e-8, one float32 ulp of the loss). Within one framework, continuation
through checkpoints is bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import optax  # noqa: E402

import dualemb.jax as dej  # noqa: E402
import dualemb.tf as de  # noqa: E402
from dualemb import interop  # noqa: E402
from dualemb.core import Table, checkpoint  # noqa: E402
from dualemb.core import initializers as ci  # noqa: E402
from dualemb.demo.config import DemoConfig, sigmoid  # noqa: E402
from dualemb.demo.jax_side import JaxRunner  # noqa: E402
from dualemb.demo.tf_side import TFRunner  # noqa: E402

PRED_TOL = 1e-5
LOSS_TOL = 2e-6
KEYS = np.array([0, 1, 7, -3, 123456789012, 2**62 + 5, -(2**63) + 1, 42, 42], np.int64)
TINY = DemoConfig(features=3, dim=4, batch_size=256, steps=6, seed=3)


def _sorted_export(tables) -> dict:
    """keys, values, slots of one logical table (a core Table or a list of shards), by key."""
    tables = tables if isinstance(tables, (list, tuple)) else [tables]
    parts = [t.export() for t in tables]
    keys = np.concatenate([p["keys"] for p in parts])
    order = np.argsort(keys, kind="stable")
    return {k: np.concatenate([p[k] for p in parts])[order]
            for k in ("keys", "values", "slots", "update_count")}


def _assert_same_table(a, b):
    ea, eb = _sorted_export(a), _sorted_export(b)
    np.testing.assert_array_equal(ea["keys"], eb["keys"])
    np.testing.assert_array_equal(ea["values"], eb["values"])
    np.testing.assert_array_equal(ea["slots"], eb["slots"])
    np.testing.assert_array_equal(ea["update_count"], eb["update_count"])


def _assert_same_dense(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


# ---- initial rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("init", [ci.normal(0.0, 0.05, seed=42),
                                  ci.truncated_normal(0.1, 0.5, seed=7),
                                  ci.uniform(-0.2, 0.3, seed=9)],
                         ids=["normal", "truncated_normal", "uniform"])
def test_same_seed_gives_the_same_initial_rows_in_tf_and_jax(init):
    one = de.Variable(dim=8, initializer=init, name="init_one")
    three = de.Variable(dim=8, initializer=init, name="init_three", devices=["/CPU:0"] * 3)
    table = dej.create(8, initializer=init)
    rows_tf = one.lookup(tf.constant(KEYS)).numpy()
    np.testing.assert_array_equal(three.lookup(tf.constant(KEYS)).numpy(), rows_tf)
    np.testing.assert_array_equal(np.asarray(dej.lookup(table, KEYS)), rows_tf)
    np.testing.assert_array_equal(np.asarray(jax.jit(dej.lookup)(table, dej.ids(KEYS))), rows_tf)
    assert one.size().numpy() == 0 and int(table.core().size()) == 0  # reads never insert
    assert np.unique(rows_tf[:-1], axis=0).shape[0] == len(KEYS) - 1  # rows differ per key


def test_keras_initializer_with_a_seed_equals_the_core_spec_in_jax():
    var = de.Variable(dim=6, initializer=keras.initializers.RandomNormal(0.0, 0.05, seed=11),
                      name="keras_init")
    table = dej.create(6, initializer=dej.initializers.normal(0.0, 0.05, seed=11))
    np.testing.assert_array_equal(var.lookup(tf.constant(KEYS)).numpy(),
                                  np.asarray(dej.lookup(table, KEYS)))


# ---- one optimizer step, same definition, same gradients ------------------------------------

@pytest.mark.parametrize("make_opt", [
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.Adagrad(0.05),
    lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.Ftrl(0.05, l1_regularization_strength=0.001),
], ids=["adam", "adagrad", "sgd_nesterov", "ftrl"])
def test_training_steps_give_identical_rows_and_slots_in_tf_and_jax(make_opt):
    dim = 5
    init = ci.normal(0.0, 0.1, seed=5)
    ids = np.array([[5, 7, 5], [2**40 + 1, 7, -3]], np.int64)  # duplicates: gradients summed
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(ids.shape + (dim,)).astype(np.float32) for _ in range(3)]

    var = de.Variable(dim=dim, initializer=init, name="parity")
    opt = de.DynamicEmbeddingOptimizer(make_opt())
    for w in weights:
        with tf.GradientTape() as tape:
            rows, anchor = de.embedding_lookup(var, tf.constant(ids), return_trainable=True)
            loss = tf.reduce_sum(rows * w)
        opt.apply_gradients(zip(tape.gradient(loss, [anchor]), [anchor]))
    core_tf = Table.attach(var.tables[0].table_id)
    spec = core_tf.optimizer
    assert spec["flavor"] == "keras"

    lr = float(opt.learning_rate.numpy())
    table = dej.create(dim, initializer=init, optimizer=dej.optimizers.from_spec(spec, lr))
    for w in weights:
        rows = dej.lookup(table, ids)
        grads = jax.grad(lambda r: jnp.sum(r * w))(rows)
        table = dej.apply_gradients(table, ids, grads)
    assert int(np.asarray(table.step)) == int(opt.iterations.numpy()) == len(weights)
    assert table.core().slot_names == core_tf.slot_names
    _assert_same_table(core_tf, table.core())


# ---- the dense optimizer --------------------------------------------------------------------

def test_keras_adam_in_optax_is_bit_identical_to_keras_adam():
    rng = np.random.default_rng(1)
    w0 = {"k": rng.standard_normal((16, 8)).astype(np.float32),
          "b": rng.standard_normal((8,)).astype(np.float32)}
    grads = [{k: (rng.standard_normal(v.shape) * 10.0 ** rng.uniform(-6, 0)).astype(np.float32)
              for k, v in w0.items()} for _ in range(300)]
    kv = {k: keras.Variable(v) for k, v in w0.items()}
    kopt = keras.optimizers.Adam(0.01)

    @tf.function
    def keras_step(g):
        kopt.apply_gradients([(g[k], kv[k]) for k in sorted(kv)])

    tx = interop.keras_adam(0.01)
    tx_fast = interop.keras_adam(0.01, exact=False)

    def jax_step(tx):
        @jax.jit
        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s
        return step

    step, step_fast = jax_step(tx), jax_step(tx_fast)
    p = {k: jnp.asarray(v) for k, v in w0.items()}
    s = tx.init(p)
    pf, sf = p, tx_fast.init(p)
    for g in grads:
        keras_step({k: tf.constant(v) for k, v in g.items()})
        p, s = step(p, s, g)
        pf, sf = step_fast(pf, sf, g)
    for k in w0:
        np.testing.assert_array_equal(np.asarray(p[k]), kv[k].numpy())
        np.testing.assert_allclose(np.asarray(pf[k]), kv[k].numpy(), rtol=1e-5, atol=1e-6)
    # the slots and step in the common names, from either side
    kmodel_dict = {f"optimizer/{k}/m": kopt._momentums[i].numpy()
                   for i, k in enumerate(sorted(kv))}
    kmodel_dict.update({f"optimizer/{k}/v": kopt._velocities[i].numpy()
                        for i, k in enumerate(sorted(kv))})
    kmodel_dict[interop.STEP] = np.int64(kopt.iterations.numpy())
    _assert_same_dense(interop.adam_state_to_dict(s), kmodel_dict)


# ---- the demo model across frameworks -------------------------------------------------------

@pytest.fixture(scope="module")
def tf_leg1(tmp_path_factory):
    """A TF model trained TINY.steps steps, its checkpoint, losses and held-out predictions."""
    path = tmp_path_factory.mktemp("interop") / "leg1-tf"
    runner = TFRunner(TINY)
    losses, _ = runner.train(0, TINY.steps, verbose=0)
    runner.save(path, {"test": True})
    ids, dense, _, _ = TINY.held_out()
    return runner, path, losses, runner.predict_logits(ids, dense)


def test_names_and_layouts_match_between_keras_and_flax(tf_leg1):
    runner, path, _, _ = tf_leg1
    names = interop.keras_variables(runner.model)
    assert list(names) == TINY.dense_names
    flax_params = JaxRunner(TINY).dense_dict()
    keras_params = runner.dense_dict()
    assert sorted(flax_params) == sorted(keras_params)
    for k in keras_params:
        assert np.shape(flax_params[k]) == np.shape(keras_params[k]), k
    manifest = checkpoint.read_manifest(path)
    assert manifest["dense"] is not None
    assert set(manifest["dense"]["tensors"]) == set(keras_params)
    assert [t["name"] for t in manifest["tables"]] == TINY.table_names
    for t in manifest["tables"]:
        assert t["optimizer"]["name"] == "adam" and t["optimizer"]["flavor"] == "keras"
        assert t["slot_names"] == ["momentum", "velocity"] and t["step"] == TINY.steps


def test_tf_checkpoint_reads_in_jax_with_slots_and_step(tf_leg1):
    runner, path, _, logits_tf = tf_leg1
    jr = JaxRunner.load(TINY, path)
    assert jr.step == TINY.steps
    for name, jt in zip(TINY.table_names, jr.tables()):
        assert int(np.asarray(jt.step)) == TINY.steps
        _assert_same_table(runner.core_tables()[name], jt.core())
    _assert_same_dense(jr.dense_dict(), runner.dense_dict())
    ids, dense, _, _ = TINY.held_out()
    diff = np.max(np.abs(sigmoid(jr.predict_logits(ids, dense)) - sigmoid(logits_tf)))
    assert diff <= PRED_TOL


def test_jax_checkpoint_reads_in_tf_with_slots_and_step(tmp_path):
    jr = JaxRunner(TINY)
    jr.train(0, 4, verbose=0)
    jr.save(tmp_path / "jax", {})
    tr = TFRunner.load(TINY, tmp_path / "jax")
    assert tr.step == 4
    for name, jt in zip(TINY.table_names, jr.tables()):
        _assert_same_table(tr.core_tables()[name], jt.core())
    _assert_same_dense(tr.dense_dict(), jr.dense_dict())
    ids, dense, _, _ = TINY.held_out()
    diff = np.max(np.abs(sigmoid(tr.predict_logits(ids, dense))
                         - sigmoid(jr.predict_logits(ids, dense))))
    assert diff <= PRED_TOL
    # both continue from the same state: the next losses agree to float32 rounding
    lt, _ = tr.train(4, 6, verbose=0)
    lj, _ = jr.train(4, 6, verbose=0)
    np.testing.assert_allclose(lt, lj, rtol=0, atol=LOSS_TOL)


def test_tf_jax_tf_continuation_matches_staying_in_tf(tf_leg1, tmp_path):
    ref_runner, path, losses1, _ = tf_leg1
    n = TINY.steps
    jr = JaxRunner.load(TINY, path)
    losses2, _ = jr.train(n, 2 * n, verbose=0)
    jr.save(tmp_path / "leg2-jax", {})
    tr = TFRunner.load(TINY, tmp_path / "leg2-jax")
    losses3, _ = tr.train(2 * n, 3 * n, verbose=0)
    # the reference: leg 1's model continued in TF (a copy, so the fixture stays at step n)
    ref = TFRunner.load(TINY, path)
    ref_losses, _ = ref.train(n, 3 * n, verbose=0)
    np.testing.assert_allclose(losses2 + losses3, ref_losses, rtol=0, atol=LOSS_TOL)
    ids, dense, _, _ = TINY.held_out()
    diff = np.max(np.abs(sigmoid(tr.predict_logits(ids, dense))
                         - sigmoid(ref.predict_logits(ids, dense))))
    assert diff <= PRED_TOL
    assert losses1[0] > ref_losses[-1]  # it learns


@pytest.mark.parametrize("runner_cls", [TFRunner, JaxRunner], ids=["tf", "jax"])
def test_continuation_within_one_framework_is_bit_identical(runner_cls, tmp_path):
    a = runner_cls(TINY)
    a.train(0, 3, verbose=0)
    a.save(tmp_path / "ck", {})
    b = runner_cls.load(TINY, tmp_path / "ck")
    la, _ = a.train(3, 8, verbose=0)
    lb, _ = b.train(3, 8, verbose=0)
    assert la == lb
    _assert_same_dense(a.dense_dict(), b.dense_dict())


def test_resharding_across_the_exchange_tf3_jax1_tf2(tmp_path):
    tf3 = TFRunner(TINY, shards=3)
    tf3.train(0, 4, verbose=0)
    for shards in tf3.core_tables().values():
        assert len(shards) == 3
        for i, t in enumerate(shards):
            keys = t.export()["keys"]
            assert len(keys) and np.all(np.mod(keys, 3) == i)
    tf3.save(tmp_path / "tf3", {})
    assert all(len(t["shards"]) == 3 for t in checkpoint.read_manifest(tmp_path / "tf3")["tables"])

    jr = JaxRunner.load(TINY, tmp_path / "tf3")
    for name, jt in zip(TINY.table_names, jr.tables()):
        _assert_same_table(tf3.core_tables()[name], jt.core())
    jr.train(4, 6, verbose=0)
    jr.save(tmp_path / "jax1", {})

    tf2 = TFRunner.load(TINY, tmp_path / "jax1", shards=2)
    assert tf2.step == 6
    for name, jt in zip(TINY.table_names, jr.tables()):
        shards = tf2.core_tables()[name]
        assert len(shards) == 2
        for i, t in enumerate(shards):
            assert np.all(np.mod(t.export()["keys"], 2) == i)
        _assert_same_table(shards, jt.core())
    ids, dense, _, _ = TINY.held_out()
    diff = np.max(np.abs(sigmoid(tf2.predict_logits(ids, dense))
                         - sigmoid(jr.predict_logits(ids, dense))))
    assert diff <= PRED_TOL
    lt, _ = tf2.train(6, 8, verbose=0)
    lj, _ = jr.train(6, 8, verbose=0)
    np.testing.assert_allclose(lt, lj, rtol=0, atol=LOSS_TOL)


def test_dense_names_of_tf_save_convert_to_interop_names(tf_leg1, tmp_path):
    from dualemb.tf import saving
    runner, _, _, _ = tf_leg1
    saving.save(runner.model, tmp_path / "de_save")
    converted = interop.from_tf_save(checkpoint.load_dense(tmp_path / "de_save"))
    _assert_same_dense(converted, runner.dense_dict())
    model = JaxRunner(TINY).model
    interop.dict_to_flax(model, converted)
    state = interop.dict_to_adam_state(converted, model)
    assert int(state.count) == TINY.steps
    # its tables (named after the de.Variables) load in JAX with slots and step
    for f, name in enumerate(TINY.table_names):
        t = dej.load(tmp_path / "de_save", f"{name}-parameter", learning_rate=0.1)
        assert int(np.asarray(t.step)) == TINY.steps
        _assert_same_table(runner.core_tables()[name], t.core())


def test_jax_load_of_a_tf_save_continues_with_the_recorded_learning_rate(tmp_path):
    """de.save records a constant learning rate, so dej.load needs no learning_rate=."""
    from dualemb.tf import saving

    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(4, name="lr_emb")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(emb(ids))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.025)), "mse")
    x = np.arange(16, dtype=np.int64).reshape(8, 2)
    model.fit(x, np.ones((8, 1), np.float32), batch_size=8, verbose=0)
    saving.save(model, tmp_path / "ckpt")
    t = dej.load(tmp_path / "ckpt", "lr_emb-parameter")
    assert t.optimizer.learning_rate == pytest.approx(0.025)
    assert t.optimizer.spec["flavor"] == "keras" and int(np.asarray(t.step)) == 1
