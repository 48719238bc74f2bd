"""DynamicEmbeddingOptimizer wraps the Keras optimizer (it does not change its class): mixed
precision with dynamic loss scaling, config round trips, and the saving paths that record the
optimizer (tf.train.Checkpoint, .keras files, de.save / de.load).

The mixed-precision references are Keras' own: the same model with a dense
``keras.layers.Embedding`` under the same policy, compiled with the same Keras optimizer, which
``compile`` wraps in Keras' ``LossScaleOptimizer``.
"""


import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dense_reference import dense_reference
from dualemb.core import checkpoint as core_ckpt

DIM = 4
WIDTH = 3
BATCH = 4
STEPS = 10
KEYS = np.array([3, 10, 42, 7, 2**40 + 5, -9], np.int64)


@pytest.fixture
def mixed_float16():
    old = keras.config.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def _batches(rng):
    out = []
    for _ in range(STEPS):
        ids = np.concatenate([KEYS, rng.choice(KEYS, BATCH * WIDTH - len(KEYS))])
        rng.shuffle(ids)
        out.append(ids.reshape(BATCH, WIDTH))
    return np.concatenate(out)


def _pair(optimizer_fn, rng, name):
    """(dense model, dynamic model, dense Embedding, dualemb Embedding, ids -> dense index)
    with the same rows and head weights, compiled under the current policy."""
    rows = rng.normal(0, 0.5, (len(KEYS), DIM)).astype(np.float32)
    kernel = rng.normal(0, 0.5, (WIDTH * DIM, 1)).astype(np.float32)

    dense_in = keras.Input((WIDTH,), dtype="int64")
    dense_emb = keras.layers.Embedding(len(KEYS), DIM)
    head = keras.layers.Dense(1)
    dense = keras.Model(dense_in, head(keras.layers.Flatten()(dense_emb(dense_in))))
    dense_emb.embeddings.assign(rows)
    head.kernel.assign(kernel)
    dense.compile(dense_reference(optimizer_fn()), "mse")

    de_in = keras.Input((WIDTH,), dtype="int64")
    de_emb = de.keras.layers.Embedding(DIM, name=name)
    de_head = keras.layers.Dense(1)
    dyn = keras.Model(de_in, de_head(keras.layers.Flatten()(de_emb(de_in))))
    de_emb.params.upsert(KEYS, rows)
    de_head.kernel.assign(kernel)
    dyn.compile(de.DynamicEmbeddingOptimizer(optimizer_fn()), "mse")
    index = {int(k): i for i, k in enumerate(KEYS)}
    return dense, dyn, dense_emb, de_emb, np.vectorize(index.__getitem__), rows


# SGD is there because it is not invariant to the gradient's scale (Adam nearly is): a step that
# forgot to unscale the embedding gradients by the loss scale (2**15) would move rows 2**15 times
# too far.
@pytest.mark.parametrize("optimizer_fn", [lambda: keras.optimizers.Adam(0.01),
                                          lambda: keras.optimizers.SGD(0.05)],
                         ids=["adam", "sgd"])
def test_mixed_float16_fit_matches_dense_embedding_with_loss_scaling(mixed_float16,
                                                                    optimizer_fn):
    rng = np.random.default_rng(11)
    dense, dyn, dense_emb, de_emb, to_index, rows = _pair(optimizer_fn, rng, "mp_fit")
    # compile wrapped the dense model's optimizer in Keras' LossScaleOptimizer and left ours.
    assert type(dense.optimizer) is keras.optimizers.LossScaleOptimizer
    assert isinstance(dyn.optimizer, de.DynamicEmbeddingOptimizerWrapper)
    assert dyn.optimizer.dynamic_loss_scale
    # The policy's compute dtype for the output, float32 in the table.
    assert dyn(KEYS[:WIDTH][None]).dtype == "float16"
    assert de_emb.params.lookup(KEYS).dtype == tf.float32

    ids = _batches(rng)
    target = rng.normal(0, 1, (len(ids), 1)).astype(np.float32)
    h_dense = dense.fit(to_index(ids), target, batch_size=BATCH, shuffle=False, verbose=0)
    h_de = dyn.fit(ids, target, batch_size=BATCH, shuffle=False, verbose=0)

    got = de_emb.params.lookup(KEYS).numpy()
    want = dense_emb.embeddings.numpy()
    assert np.abs(got - rows).max() > 0.02  # the rows trained
    # Both forward passes cast the same float32 rows to float16 and run the same float16 ops;
    # they differ only in the float32 order in which duplicate ids' gradients are summed, which
    # can flip the last float16 bit (5e-4 relative) of a later forward pass. That changes a
    # row's step by about lr * 1e-3; a wrong unscaling or update differs by orders more.
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
    np.testing.assert_allclose(h_de.history["loss"], h_dense.history["loss"], rtol=2e-3)
    np.testing.assert_allclose(dyn.layers[-1].kernel.numpy(), dense.layers[-1].kernel.numpy(),
                               rtol=0, atol=2e-4)
    # The same dynamic loss-scale history as Keras' LossScaleOptimizer: with SGD the first
    # step's float16 gradients overflow at the initial scale 2**15, so both skip it (iterations
    # 9, scale halved) and then agree on every later step.
    assert int(dyn.optimizer.iterations) == int(dense.optimizer.iterations) >= STEPS - 1
    assert float(dyn.optimizer.dynamic_scale) == float(dense.optimizer.dynamic_scale)
    assert int(dyn.optimizer.step_counter) == int(dense.optimizer.step_counter)


def _tape_step(opt, var, keys, weights, dense=None):
    keys = tf.constant(keys, tf.int64)
    with tf.GradientTape() as tape:
        emb, trainable = de.embedding_lookup(var, keys, name="t", return_trainable=True)
        loss = tf.reduce_sum(emb * tf.constant(weights, tf.float32))
        variables = [trainable]
        if dense is not None:
            loss += tf.reduce_sum(dense * 1.0)
            variables.append(dense)
        loss = opt.scale_loss(loss)
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def test_non_finite_gradient_skips_the_step_and_halves_the_scale():
    var = de.Variable(dim=2, initializer=1.0, name="mp_skip")
    dense = keras.Variable(np.ones(2, np.float32))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=8.0, dynamic_growth_steps=2))
    _tape_step(opt, var, [1], [[1.0, 2.0]], dense)
    # Unscaled by 8: rows 1 - 0.5 * g, dense 1 - 0.5.
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[0.5, 0.0]])
    np.testing.assert_allclose(dense.numpy(), [0.5, 0.5])
    assert int(opt.iterations) == 1 and float(opt.dynamic_scale) == 8.0

    _tape_step(opt, var, [1, 2], [[np.inf, 1.0], [1.0, 1.0]], dense)
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[0.5, 0.0]])  # nothing written
    assert sorted(var.export()[0].numpy().tolist()) == [1]            # key 2 not inserted
    np.testing.assert_allclose(dense.numpy(), [0.5, 0.5])
    assert int(opt.iterations) == 1 and float(opt.dynamic_scale) == 4.0

    for _ in range(2):  # two finite steps in a row double the scale
        _tape_step(opt, var, [2], [[1.0, 1.0]])
    assert int(opt.iterations) == 3 and float(opt.dynamic_scale) == 8.0
    np.testing.assert_allclose(var.lookup([2]).numpy(), [[0.0, 0.0]])


def test_the_optimizer_given_is_left_unchanged(mixed_float16):
    adam = keras.optimizers.Adam(0.01, loss_scale_factor=None, clipnorm=1.0)
    before = (type(adam), adam.loss_scale_factor, adam.clipnorm, len(adam.variables))
    inp = keras.Input((WIDTH,), dtype="int64")
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(
        de.keras.layers.Embedding(DIM, name="mp_unchanged")(inp))))
    model.compile(de.DynamicEmbeddingOptimizer(adam), "mse")
    model.fit(_batches(np.random.default_rng(0))[:8], np.ones((8, 1), np.float32), batch_size=4,
              verbose=0)
    assert model.optimizer.inner_optimizer is adam
    assert (type(adam), adam.loss_scale_factor, adam.clipnorm) == before[:3]
    # It trained the Dense layer (a step whose float16 gradients overflow is skipped).
    assert model.optimizer.iterations is adam.iterations and int(adam.iterations) >= 1
    assert len(adam.variables) == before[3] + 4  # Adam's m and v of the kernel and the bias


def test_get_config_round_trip():
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.1, 5, 0.5),
                              beta_1=0.7, clipnorm=2.0),
        initial_scale=64.0, dynamic_growth_steps=7), bp_v2=True)
    config = keras.optimizers.serialize(opt)
    back = keras.optimizers.deserialize(config)
    assert type(back) is de.DynamicEmbeddingOptimizerWrapper
    assert (back.dynamic_loss_scale, back.initial_scale, back.dynamic_growth_steps,
            back.bp_v2) == (True, 64.0, 7, True)
    inner = back.inner_optimizer
    assert type(inner) is keras.optimizers.Adam
    assert (inner.beta_1, inner.clipnorm) == (0.7, 2.0)
    assert isinstance(inner._learning_rate, keras.optimizers.schedules.ExponentialDecay)
    assert keras.optimizers.serialize(back) == config


def test_legacy_wrapped_class_name_still_loads():
    """Models saved when the wrapper changed the optimizer's class name it
    dualemb>DynamicEmbedding<Base>, with the optimizer's own config."""
    config = keras.optimizers.serialize(keras.optimizers.RMSprop(0.02, momentum=0.4))
    config["registered_name"] = "dualemb>DynamicEmbeddingRMSprop"
    back = keras.optimizers.deserialize(config)
    assert isinstance(back, de.DynamicEmbeddingOptimizerWrapper)
    assert type(back.inner_optimizer) is keras.optimizers.RMSprop
    assert back.momentum == 0.4 and float(back.learning_rate) == pytest.approx(0.02)


def _model(name, policy=None):
    inp = keras.Input((WIDTH,), dtype="int64")
    emb = de.keras.layers.Embedding(DIM, name=name, dtype=policy)
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(emb(inp))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01))), "mse")
    return model, emb


def _train(model, seed, n=16):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-20, 20, (n, WIDTH))
    model.fit(ids, rng.normal(size=(n, 1)).astype(np.float32), batch_size=4, verbose=0)


def test_saving_paths_keep_the_wrapped_state(tmp_path):
    model, emb = _model("wrap_save", policy="mixed_bfloat16")
    _train(model, 0)
    opt = model.optimizer
    keys = np.arange(-20, 20, dtype=np.int64)
    rows = emb.params.lookup(keys).numpy()
    inner_vars = [v.numpy() for v in opt.inner_optimizer.variables]
    assert int(opt.iterations) == 4

    # tf.train.Checkpoint
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    path = ckpt.write(str(tmp_path / "tf"))
    _train(model, 1)
    assert int(opt.iterations) == 8
    ckpt.read(path).assert_consumed()
    assert int(opt.iterations) == 4
    np.testing.assert_array_equal(emb.params.lookup(keys).numpy(), rows)
    for v, want in zip(opt.inner_optimizer.variables, inner_vars):
        np.testing.assert_array_equal(v.numpy(), want)

    # .keras file: a fresh process would rebuild the wrapper from its config
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    lopt = loaded.optimizer
    assert isinstance(lopt, de.DynamicEmbeddingOptimizerWrapper) and lopt.dynamic_loss_scale
    assert int(lopt.iterations) == 4
    for v, want in zip(lopt.inner_optimizer.variables, inner_vars):
        np.testing.assert_array_equal(v.numpy(), want)
    lemb = loaded.get_layer("wrap_save")
    assert lemb.dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_array_equal(lemb.params.lookup(keys).numpy(), rows)

    # de.save / de.load record the step and the constant learning rate of the wrapped optimizer
    de.save(model, tmp_path / "common")
    manifest = core_ckpt.read_manifest(str(tmp_path / "common"))
    assert manifest["metadata"]["learning_rates"] == {"wrap_save-parameter": pytest.approx(0.01)}
    assert {t["step"] for t in manifest["tables"]} == {4}
    _train(model, 2)
    de.load(model, tmp_path / "common")
    assert int(opt.iterations) == 4
    np.testing.assert_array_equal(emb.params.lookup(keys).numpy(), rows)


def test_layer_output_follows_the_dtype_policy():
    ids = tf.constant([[1, 2, 3]], tf.int64)
    for policy, want in ((None, tf.float32), ("mixed_float16", tf.float16),
                         ("mixed_bfloat16", tf.bfloat16)):
        layer = de.keras.layers.Embedding(DIM, name=f"policy_emb_{policy}", dtype=policy,
                                          initializer=keras.initializers.RandomNormal(seed=1))
        out = layer(ids)
        rows = layer.params.lookup(ids)  # the table stays float32
        assert out.dtype == want and rows.dtype == tf.float32
        np.testing.assert_array_equal(out.numpy(), tf.cast(rows, want).numpy())

        squashed = de.keras.layers.SquashedEmbedding(
            DIM, name=f"policy_sq_{policy}", dtype=policy,
            initializer=keras.initializers.RandomNormal(seed=2))
        pooled = tf.reduce_sum(squashed.params.lookup(ids), axis=1)  # pooled in float32
        np.testing.assert_array_equal(squashed(ids).numpy(), tf.cast(pooled, want).numpy())

        field = de.keras.layers.FieldWiseEmbedding(DIM, 2, name=f"policy_field_{policy}",
                                                   dtype=policy)
        assert field(ids).dtype == want
        config = layer.get_config()
        back = de.keras.layers.Embedding.from_config(dict(config, name=f"policy_cfg_{policy}"))
        assert back.compute_dtype == want.name
