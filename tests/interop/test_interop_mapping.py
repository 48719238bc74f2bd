"""dualemb.interop: Keras weights <-> {name: array} <-> Flax params, names, layouts, strictness,
and the Adam slots in both directions."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from flax import nnx  # noqa: E402

from dualemb import interop  # noqa: E402


class KerasNet(keras.Model):
    def __init__(self):
        super().__init__(name="net")
        self.emb = keras.layers.Embedding(10, 4, name="emb")
        self.fc0 = keras.layers.Dense(6, activation="relu", name="fc0")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")
        self.bn = keras.layers.BatchNormalization(name="bn")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, ids, training=False):
        x = keras.ops.reshape(self.emb(ids), (-1, 8))
        x = self.norm(self.fc0(x))
        return self.out(self.bn(x, training=training))


class FlaxNet(nnx.Module):
    def __init__(self, rngs):
        self.emb = nnx.Embed(10, 4, rngs=rngs)
        self.fc0 = nnx.Linear(8, 6, rngs=rngs)
        self.norm = nnx.LayerNorm(6, epsilon=1e-6, rngs=rngs)
        self.bn = nnx.BatchNorm(6, use_running_average=True, epsilon=1e-3, rngs=rngs)
        self.out = nnx.Linear(6, 1, rngs=rngs)

    def __call__(self, ids):
        x = self.emb(ids).reshape(-1, 8)
        x = self.norm(nnx.relu(self.fc0(x)))
        return self.out(self.bn(x))


@pytest.fixture(scope="module")
def nets():
    k = KerasNet()
    ids = np.array([[1, 2], [3, 9], [0, 0]], np.int32)
    k(ids)
    rng = np.random.default_rng(0)
    for v in k.weights:  # non-trivial values everywhere (incl. gamma, moving stats)
        v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
    return k, FlaxNet(nnx.Rngs(0)), ids


def test_keras_names_follow_flax_paths(nets):
    k, f, _ = nets
    names = set(interop.keras_weights_to_dict(k))
    assert names == {"emb/embedding", "fc0/kernel", "fc0/bias", "norm/scale", "norm/bias",
                     "bn/scale", "bn/bias", "bn/mean", "bn/var", "out/kernel", "out/bias"}
    flax_names = set(interop.flax_params_to_dict(f, filter=nnx.Variable))
    assert names == flax_names


def test_keras_to_flax_gives_the_same_function(nets):
    k, f, ids = nets
    d = interop.keras_weights_to_dict(k)
    assert d["fc0/kernel"].shape == (8, 6)  # [in, out] in both: no transpose
    interop.dict_to_flax(f, d, filter=nnx.Variable)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(ids))), k(ids).numpy(), rtol=1e-5,
                               atol=1e-5)
    back = interop.flax_params_to_dict(f, filter=nnx.Variable)
    for name, value in d.items():
        np.testing.assert_array_equal(back[name], value)


def test_flax_to_keras_round_trip(nets):
    k, f, _ = nets
    k2 = KerasNet()
    k2(np.zeros((1, 2), np.int32))
    params = interop.flax_params_to_dict(f, filter=nnx.Variable)
    interop.dict_to_keras(k2, params)
    got = interop.keras_weights_to_dict(k2)
    for name, value in params.items():
        np.testing.assert_array_equal(got[name], value)


def test_pure_dict_templates(nets):
    _, f, _ = nets
    pure = nnx.to_pure_dict(nnx.state(f, nnx.Param))
    flat = interop.flax_params_to_dict(pure)
    assert interop.flatten(interop.unflatten(flat)).keys() == flat.keys()
    new = interop.dict_to_flax(pure, {k: v + 1 for k, v in flat.items()})
    assert isinstance(new, dict)
    np.testing.assert_array_equal(np.asarray(new["fc0"]["bias"]), flat["fc0/bias"] + 1)


def test_strict_matching_and_shapes(nets):
    k, f, _ = nets
    d = interop.keras_weights_to_dict(k)
    before = interop.flax_params_to_dict(f, filter=nnx.Variable)
    with pytest.raises(KeyError, match="missing"):
        interop.dict_to_flax(f, {n: v for n, v in d.items() if n != "out/bias"},
                             filter=nnx.Variable)
    with pytest.raises(KeyError, match="unknown"):
        interop.dict_to_keras(k, {**d, "extra/kernel": np.zeros(3, np.float32)})
    bad = dict(d, **{"fc0/bias": np.zeros(7, np.float32)})
    with pytest.raises(ValueError, match="fc0/bias"):
        interop.dict_to_flax(f, bad, filter=nnx.Variable)
    with pytest.raises(ValueError, match="fc0/bias"):
        interop.dict_to_keras(k, bad)
    after = interop.flax_params_to_dict(f, filter=nnx.Variable)
    for n in before:  # nothing assigned by the failed calls
        np.testing.assert_array_equal(before[n], after[n])
    np.testing.assert_array_equal(interop.keras_weights_to_dict(k)["fc0/kernel"], d["fc0/kernel"])
    # non-strict: a subset is fine
    interop.dict_to_flax(f, {"out/bias": d["out/bias"]}, strict=False, filter=nnx.Variable)


def test_name_map(nets):
    k, _, _ = nets
    d = interop.keras_weights_to_dict(k, name_map={"fc0/kernel": "dense/w"})
    assert "dense/w" in d and "fc0/kernel" not in d
    d = interop.keras_weights_to_dict(k, name_map=lambda n: None if n.startswith("bn/") else n)
    assert not any(n.startswith("bn/") for n in d)


def test_adam_slots_move_both_ways():
    k = keras.Sequential([keras.layers.Dense(3, name="fc0"), keras.layers.Dense(1, name="out")],
                         name="seq")
    k.build((None, 4))
    opt = keras.optimizers.Adam(0.01)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(k(x) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, k.trainable_variables),
                                k.trainable_variables))
    d = interop.keras_weights_to_dict(k, optimizer=opt)
    assert int(d[interop.STEP]) == 3
    assert {n for n in d if n.startswith("optimizer/")} == {
        interop.STEP, *(f"optimizer/{p}/{s}" for p in ("fc0/kernel", "fc0/bias", "out/kernel",
                                                        "out/bias") for s in ("m", "v"))}
    params = interop.unflatten({n: jnp.asarray(v) for n, v in d.items()
                                if not n.startswith("optimizer/")})
    state = interop.dict_to_adam_state(d, params)
    assert int(state.count) == 3
    back = interop.adam_state_to_dict(state)
    for n, v in back.items():
        np.testing.assert_array_equal(v, d[n])
    # and into a fresh Keras optimizer
    opt2 = keras.optimizers.Adam(0.01)
    interop.dict_to_keras_optimizer(opt2, k, back)
    assert int(opt2.iterations.numpy()) == 3
    d2 = interop.keras_weights_to_dict(k, optimizer=opt2)
    for n in back:
        np.testing.assert_array_equal(d2[n], back[n])


def test_importing_interop_imports_no_framework():
    code = ("import sys, dualemb.interop; "
            "bad = [m for m in ('tensorflow', 'jax', 'keras', 'flax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_optimizer_slots_of_skipped_weights_are_not_lost_silently():
    k = keras.Sequential([keras.layers.Dense(3, name="fc0"), keras.layers.Dense(1, name="out")],
                         name="seq2")
    k.build((None, 4))
    opt = keras.optimizers.Adam(0.01)
    opt.build(k.trainable_variables)
    skip_out = lambda n: None if n.startswith("out/") else n  # noqa: E731
    with pytest.raises(ValueError, match="belong to no weight"):
        interop.keras_weights_to_dict(k, optimizer=opt, name_map=skip_out)
    d = interop.keras_weights_to_dict(k, optimizer=opt, name_map=skip_out, strict=False)
    assert not any("out/" in n for n in d)


def test_interop_imports_neither_tf_nor_jax_and_keras_adam_lives_with_the_jax_optimizers():
    """interop is name mapping: importing it loads no framework; keras_adam (an Optax
    transformation) lives in dualemb.jax.keras_optax and is re-exported under its documented
    name."""
    import subprocess
    import sys
    code = ("import sys, dualemb.interop as i\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'jax', 'flax', 'optax', 'tensorflow', 'keras'})\n"
            "assert not heavy, heavy\n"
            "from dualemb.jax import keras_optax\n"
            "assert i.keras_adam is keras_optax.keras_adam\n"
            "assert i.KerasAdamState is keras_optax.KerasAdamState\n"
            "assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_flatten_matches_flax_traverse_util():
    from flax import traverse_util
    tree = {"fc0": {"kernel": 1, "bias": 2}, "layers": {0: {"w": 3}, 1: {"w": 4}}, "empty": {}}
    flat = interop.flatten(tree)
    assert flat == {"fc0/kernel": 1, "fc0/bias": 2, "layers/0/w": 3, "layers/1/w": 4}
    assert flat == {"/".join(map(str, k)): v
                    for k, v in traverse_util.flatten_dict(tree).items()}
    assert interop.unflatten(flat) == {"fc0": {"kernel": 1, "bias": 2},
                                       "layers": {"0": {"w": 3}, "1": {"w": 4}}}
    assert interop.flatten({"a": {"b": 1}}, sep=".") == {"a.b": 1}
