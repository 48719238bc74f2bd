"""Parity of the core's fused sparse optimizers with Keras 3 and Optax.

Every case trains a dualemb table preloaded with known rows and, side by side, a dense reference
made of the same rows: for flavor=keras a ``keras.Variable`` updated by the real
``keras.optimizers.X`` (TF backend) through ``apply_gradients``; for flavor=optax a jnp array
updated by the real ``optax.X`` transformation. Each of the 10 steps feeds every trained row, with
duplicate ids, so the table's per-key summed gradient equals the reference's dense gradient
(``np.add.at`` of the per-id gradients). One more preloaded row never appears in a batch and must
stay bit-for-bit untouched, slots included.

Tolerance: rows and slots within rtol=1e-5, atol=1e-6 (slots atol=1e-7) after every step. The
core evaluates each formula in the framework's float32 operation order, so most cases are in fact
bit-for-bit identical (asserted for the cases in EXACT on x86-64 CPUs). The known exceptions come
from the frameworks' own elementary functions, which are not correctly rounded:
  * Keras Ftrl: TF's pow(x, -learning_rate_power) (Eigen's vectorised pow, within ~1 ulp, and even
    position-dependent) vs the core's sqrt/powf. Ftrl's `linear` slot accumulates
    (pow(n_new) - pow(n_old)) / lr * w, a cancellation that turns one ulp of pow into ~1e-6 of
    |linear|; it is compared with atol = 1e-5 * max|linear|.
  * Optax adagrad and rmsprop (eps_in_sqrt=True): XLA's rsqrt (hardware estimate + Newton steps,
    within ~2 ulp, CPU-dependent) vs the core's 1/sqrt.
  * Optax's division of a moment by its bias correction: XLA up to jax 0.12.0 evaluates it as a
    multiplication by the reciprocal, as the core does; from jax 0.12.1 XLA divides. There the
    Optax reference is made to round that one operation as the core does
    (tests/xla_division.py), and the unchanged Optax is still checked within the tolerance.
"""

from __future__ import annotations

import math
import os
import platform
import zlib

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

from dualemb.core import Table
from xla_division import optax_rounds_as_the_core, xla_divides_by_scalar

DIM = 7  # not a multiple of the SIMD width: exercises the loops' tails
TRAINED = np.array([11, 22, 33, 44, 55], np.int64)
UNTOUCHED = np.int64(99)
STEPS = 10
RTOL, ATOL, SLOT_ATOL = 1e-5, 1e-6, 1e-7

CONST = [0.05] * STEPS
# A non-trivial schedule: warm-up, then oscillating decay.
SCHED = [0.02 + 0.1 * (t + 1) / 3 if t < 3 else 0.12 * (0.85 ** t) * (1.2 + 0.5 * math.sin(t))
         for t in range(STEPS)]
BIG = [1.0] * STEPS  # Adadelta's effective step is lr * O(sqrt(eps)/...)

# Cases whose rows and slots are bit-for-bit equal to the framework's (x86-64 CPU).
EXACT = {
    "keras": {"sgd", "sgd-momentum", "sgd-nesterov-sched", "adagrad", "adagrad-hyper-sched", "adam",
              "adam-hyper", "adam-amsgrad-sched", "adamw", "adamw-amsgrad-sched", "adamax",
              "adamax-sched", "nadam", "nadam-sched", "rmsprop", "rmsprop-momentum",
              "rmsprop-centered", "rmsprop-centered-momentum-sched", "ftrl-power0", "adadelta",
              "adadelta-rho", "lion", "lion-sched"},
    "optax": {"sgd", "sgd-momentum", "sgd-nesterov-sched", "adam", "adam-hyper", "adam-nesterov",
              "amsgrad-sched", "amsgrad-nobias", "adamw", "adamw-nesterov-sched", "adamax",
              "adamax-sched", "nadam", "nadam-sched", "rmsprop-biascorr", "adadelta",
              "adadelta-decay-sched", "lion", "lion-nodecay-sched"},
}
CHECK_EXACT = platform.machine().lower() in ("x86_64", "amd64")


def _keras():
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the Keras references need KERAS_BACKEND=tensorflow (set before keras import)")
    return keras


def _optax():
    pytest.importorskip("jax")
    return pytest.importorskip("optax")


# (test id, spec dict, reference factory taking the first learning rate, learning rates)
def K(name, **hyper):
    return {"name": name, "flavor": "keras", **hyper}


def O(name, **hyper):
    return {"name": name, "flavor": "optax", **hyper}


def _k(cls, **kw):
    return lambda lr: getattr(_keras().optimizers, cls)(learning_rate=lr, **kw)


KERAS_CASES = [
    ("sgd", K("sgd"), _k("SGD"), CONST),
    ("sgd-momentum", K("sgd", momentum=0.9), _k("SGD", momentum=0.9), CONST),
    ("sgd-nesterov-sched", K("sgd", momentum=0.8, nesterov=True),
     _k("SGD", momentum=0.8, nesterov=True), SCHED),
    ("adagrad", K("adagrad"), _k("Adagrad"), CONST),
    ("adagrad-hyper-sched", K("adagrad", initial_accumulator_value=0.5, epsilon=1e-5),
     _k("Adagrad", initial_accumulator_value=0.5, epsilon=1e-5), SCHED),
    ("adam", K("adam"), _k("Adam"), CONST),
    ("adam-hyper", K("adam", beta_1=0.8, beta_2=0.99, epsilon=1e-6),
     _k("Adam", beta_1=0.8, beta_2=0.99, epsilon=1e-6), CONST),
    ("adam-amsgrad-sched", K("adam", amsgrad=True), _k("Adam", amsgrad=True), SCHED),
    ("adamw", K("adamw"), _k("AdamW"), CONST),
    ("adamw-amsgrad-sched", K("adamw", weight_decay=0.1, amsgrad=True),
     _k("AdamW", weight_decay=0.1, amsgrad=True), SCHED),
    ("adamax", K("adamax"), _k("Adamax"), CONST),
    ("adamax-sched", K("adamax", beta_1=0.7, epsilon=1e-5), _k("Adamax", beta_1=0.7, epsilon=1e-5),
     SCHED),
    ("nadam", K("nadam"), _k("Nadam"), CONST),
    ("nadam-sched", K("nadam", beta_1=0.85, beta_2=0.98), _k("Nadam", beta_1=0.85, beta_2=0.98),
     SCHED),
    ("rmsprop", K("rmsprop"), _k("RMSprop"), CONST),
    ("rmsprop-momentum", K("rmsprop", momentum=0.5), _k("RMSprop", momentum=0.5), CONST),
    ("rmsprop-centered", K("rmsprop", centered=True, rho=0.8),
     _k("RMSprop", centered=True, rho=0.8), CONST),
    ("rmsprop-centered-momentum-sched", K("rmsprop", centered=True, momentum=0.9),
     _k("RMSprop", centered=True, momentum=0.9), SCHED),
    ("ftrl", K("ftrl"), _k("Ftrl"), CONST),
    ("ftrl-regularized-sched",
     K("ftrl", l1_regularization_strength=0.01, l2_regularization_strength=0.02,
       l2_shrinkage_regularization_strength=0.03, beta=0.5, initial_accumulator_value=0.2),
     _k("Ftrl", l1_regularization_strength=0.01, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.03, beta=0.5, initial_accumulator_value=0.2), SCHED),
    ("ftrl-power", K("ftrl", learning_rate_power=-0.3), _k("Ftrl", learning_rate_power=-0.3),
     CONST),
    ("ftrl-power0", K("ftrl", learning_rate_power=0.0, l2_regularization_strength=0.1),
     _k("Ftrl", learning_rate_power=0.0, l2_regularization_strength=0.1), CONST),
    ("adadelta", K("adadelta"), _k("Adadelta"), BIG),
    ("adadelta-rho", K("adadelta", rho=0.7, epsilon=1e-4), _k("Adadelta", rho=0.7, epsilon=1e-4),
     SCHED),
    ("lion", K("lion"), _k("Lion"), CONST),
    ("lion-sched", K("lion", beta_1=0.5, beta_2=0.9), _k("Lion", beta_1=0.5, beta_2=0.9), SCHED),
]


def _o(fn, **kw):
    return lambda lr: getattr(_optax(), fn)(learning_rate=lr, **kw)


OPTAX_CASES = [
    ("sgd", O("sgd"), _o("sgd"), CONST),
    ("sgd-momentum", O("sgd", momentum=0.9), _o("sgd", momentum=0.9), CONST),
    ("sgd-nesterov-sched", O("sgd", momentum=0.8, nesterov=True),
     _o("sgd", momentum=0.8, nesterov=True), SCHED),
    ("adagrad", O("adagrad"), _o("adagrad"), CONST),
    ("adagrad-hyper-sched", O("adagrad", initial_accumulator_value=0.0, eps=1e-5),
     _o("adagrad", initial_accumulator_value=0.0, eps=1e-5), SCHED),
    ("adam", O("adam"), _o("adam"), CONST),
    ("adam-hyper", O("adam", b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8),
     _o("adam", b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8), CONST),
    ("adam-nesterov", O("adam", nesterov=True), _o("adam", nesterov=True), CONST),
    ("amsgrad-sched", O("adam", amsgrad=True), _o("amsgrad"), SCHED),
    ("amsgrad-nobias", O("adam", amsgrad=True, bias_correction_mu=False, bias_correction_nu=False),
     _o("amsgrad", bias_correction_mu=False, bias_correction_nu=False), CONST),
    ("adamw", O("adamw"), _o("adamw"), CONST),
    ("adamw-nesterov-sched", O("adamw", weight_decay=0.05, nesterov=True),
     _o("adamw", weight_decay=0.05, nesterov=True), SCHED),
    ("adamax", O("adamax"), _o("adamax"), CONST),
    ("adamax-sched", O("adamax", b1=0.7, eps=1e-5), _o("adamax", b1=0.7, eps=1e-5), SCHED),
    ("nadam", O("nadam"), _o("nadam"), CONST),
    ("nadam-sched", O("nadam", b1=0.85, b2=0.98), _o("nadam", b1=0.85, b2=0.98), SCHED),
    ("rmsprop", O("rmsprop"), _o("rmsprop"), CONST),
    ("rmsprop-momentum", O("rmsprop", momentum=0.5), _o("rmsprop", momentum=0.5), CONST),
    ("rmsprop-centered", O("rmsprop", centered=True, decay=0.8),
     _o("rmsprop", centered=True, decay=0.8), CONST),
    ("rmsprop-centered-nesterov-sched", O("rmsprop", centered=True, momentum=0.9, nesterov=True),
     _o("rmsprop", centered=True, momentum=0.9, nesterov=True), SCHED),
    ("rmsprop-biascorr", O("rmsprop", bias_correction=True, eps_in_sqrt=False, initial_scale=0.1),
     _o("rmsprop", bias_correction=True, eps_in_sqrt=False, initial_scale=0.1), CONST),
    ("adadelta", O("adadelta"), _o("adadelta"), BIG),
    ("adadelta-decay-sched", O("adadelta", rho=0.7, eps=1e-4, weight_decay=0.01),
     _o("adadelta", rho=0.7, eps=1e-4, weight_decay=0.01), SCHED),
    ("lion", O("lion"), _o("lion"), CONST),
    ("lion-nodecay-sched", O("lion", b1=0.5, b2=0.9, weight_decay=0.0),
     _o("lion", b1=0.5, b2=0.9, weight_decay=0.0), SCHED),
]


def _batches(seed):
    """STEPS batches: every trained id, plus duplicates, shuffled; per-id gradients."""
    rng = np.random.RandomState(seed)
    out = []
    for t in range(STEPS):
        ids = np.concatenate([TRAINED, rng.choice(TRAINED, 7)])
        rng.shuffle(ids)
        grads = (rng.randn(len(ids), DIM) * rng.choice([0.05, 0.5, 2.0])).astype(np.float32)
        grads[rng.rand(*grads.shape) < 0.05] = 0.0  # some exact zeros
        out.append((ids, grads))
    return out


def _dense_grad(ids, grads):
    dense = np.zeros((len(TRAINED), DIM), np.float32)
    np.add.at(dense, np.searchsorted(TRAINED, ids), grads)
    return dense


def _preloaded_table(spec, seed):
    rng = np.random.RandomState(1000 + seed)
    init = rng.randn(len(TRAINED) + 1, DIM).astype(np.float32)
    table = Table(dim=DIM, key_dtype="int64", initializer="zeros", optimizer=spec)
    table.insert_or_assign(np.append(TRAINED, UNTOUCHED), init)
    return table, init


def _export_by_key(table, keys):
    out = table.export()
    order = {int(k): i for i, k in enumerate(out["keys"])}
    idx = np.array([order[int(k)] for k in keys])
    return out["values"][idx], out["slots"][idx]


def _check_untouched(table, init, slots_before):
    values, slots = _export_by_key(table, [UNTOUCHED])
    assert np.array_equal(values[0].view(np.int32), init[-1].view(np.int32))
    assert np.array_equal(slots[0].view(np.int32), slots_before.view(np.int32))


def _optax_state_leaves(state, names):
    """{field name: array} for the named fields of the (nested) optax state."""
    found = {}

    def walk(s):
        if hasattr(s, "_fields"):
            for f in s._fields:
                v = getattr(s, f)
                if f in names and f not in found and hasattr(v, "shape"):
                    found[f] = np.asarray(v)
                else:
                    walk(v)
        elif isinstance(s, (tuple, list)):
            for v in s:
                walk(v)

    walk(state)
    return found


def _compare(flavor, name, what, actual, desired, slot=None):
    if slot is not None:
        atol = SLOT_ATOL
        if flavor == "keras" and name.startswith("ftrl") and slot == "linear":
            atol = 1e-5 * float(np.abs(desired).max())  # see the module docstring
    else:
        atol = ATOL
    np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=atol, err_msg=f"{name}: {what}")
    if CHECK_EXACT and name in EXACT[flavor]:
        np.testing.assert_array_equal(actual, desired, err_msg=f"{name}: {what} not bit-exact")


def _check_spec_roundtrip(table):
    _, opt = table.describe()
    again = Table(dim=DIM, optimizer=opt)
    try:
        assert again.describe()[1] == opt
        assert again.slot_names == table.slot_names
    finally:
        again.destroy()


@pytest.mark.parametrize("case", KERAS_CASES, ids=[c[0] for c in KERAS_CASES])
def test_keras_parity(case):
    keras = _keras()
    name, spec, make_ref, lrs = case
    seed = zlib.crc32(name.encode()) % 1000
    table, init = _preloaded_table(spec, seed)
    try:
        _, slots0 = _export_by_key(table, [UNTOUCHED])
        import tensorflow as tf

        with tf.device("/CPU:0"):
            var = keras.Variable(init[:-1].copy(), dtype="float32", name="emb")
            opt = make_ref(lrs[0])
            for t, (ids, grads) in enumerate(_batches(seed)):
                opt.learning_rate = lrs[t]
                opt.apply_gradients([(_dense_grad(ids, grads), var)])
                table.apply_gradients(ids, grads, lr=lrs[t], step=t + 1)

                values, slots = _export_by_key(table, TRAINED)
                _compare("keras", name, f"rows after step {t + 1}", values, np.asarray(var))
                ref_slots = {v.name[len("emb_"):]: np.asarray(v) for v in opt.variables
                             if v.name.startswith("emb_")}
                assert table.slot_names == list(ref_slots), (table.slot_names, list(ref_slots))
                for s, slot in enumerate(table.slot_names):
                    _compare("keras", name, f"slot {slot} after step {t + 1}", slots[:, s],
                             ref_slots[slot], slot=slot)
        found, _ = table.find(TRAINED)
        _compare("keras", name, "find()", found, np.asarray(var))
        _check_untouched(table, init, slots0[0])
        _check_spec_roundtrip(table)
    finally:
        table.destroy()


@pytest.mark.parametrize("case", OPTAX_CASES, ids=[c[0] for c in OPTAX_CASES])
def test_optax_parity(case, monkeypatch):
    optax = _optax()
    import jax
    import jax.numpy as jnp

    name, spec, make_ref, lrs = case
    seed = zlib.crc32(name.encode()) % 1000
    table, init = _preloaded_table(spec, seed)
    try:
        _, slots0 = _export_by_key(table, [UNTOUCHED])

        def reference():  # Optax's rows after each step
            if lrs is CONST:
                tx = make_ref(lrs[0])
            else:
                sched = jnp.asarray(lrs, jnp.float32)
                tx = make_ref(lambda count: sched[count])
            params = jnp.asarray(init[:-1])
            state = tx.init(params)
            for ids, grads in _batches(seed):
                updates, state = tx.update(jnp.asarray(_dense_grad(ids, grads)), state, params)
                params = optax.apply_updates(params, updates)
                yield params, state

        with jax.default_device(jax.devices("cpu")[0]):
            # Where XLA rounds Optax's bias correction otherwise than the core (jax >= 0.12.1):
            # Optax as it is, within float32 tolerance, then rounding that one operation as the
            # core does (tests/xla_division.py), bit for bit.
            as_is = [np.asarray(p) for p, _ in reference()] if xla_divides_by_scalar() else None
            optax_rounds_as_the_core(monkeypatch)
            for t, ((ids, grads), (params, state)) in enumerate(zip(_batches(seed), reference())):
                table.apply_gradients(ids, grads, lr=lrs[t], step=t + 1)

                values, slots = _export_by_key(table, TRAINED)
                if as_is is not None:
                    np.testing.assert_allclose(values, as_is[t], rtol=RTOL, atol=ATOL,
                                               err_msg=f"{name}: rows after step {t + 1}")
                _compare("optax", name, f"rows after step {t + 1}", values, np.asarray(params))
                ref_slots = _optax_state_leaves(state, set(table.slot_names))
                assert sorted(ref_slots) == sorted(table.slot_names), (table.slot_names,
                                                                       ref_slots)
                for s, slot in enumerate(table.slot_names):
                    _compare("optax", name, f"slot {slot} after step {t + 1}", slots[:, s],
                             ref_slots[slot], slot=slot)
        _check_untouched(table, init, slots0[0])
        _check_spec_roundtrip(table)
    finally:
        table.destroy()



@pytest.mark.parametrize("beta_1, schedule_decay", [(0.9, 0.004), (0.999, 0.004), (0.999, 0.5)])
def test_legacy_nadam_schedule_past_kerass_table(beta_1, schedule_decay):
    """schedule_decay=d is tf_keras' legacy Nadam (momentum factor beta_1*(1 - 0.5*0.96^(d*t)),
    its momentum_cache the running product). With d < 1 the factor is not beta_1 yet at step
    1024, where the Keras 3 table stops: the core's table runs on until the product is below
    2^-25 or the factor is beta_1. Checked against the legacy optimizer past step 1024."""
    tf_keras = pytest.importorskip("tf_keras", reason="tf-keras (the test extra) is not installed")
    import tensorflow as tf

    spec = K("nadam", beta_1=beta_1, schedule_decay=schedule_decay)
    table, init = _preloaded_table(spec, 7)
    rng = np.random.RandomState(7)
    try:
        var = tf.Variable(init[:1].copy())
        opt = tf_keras.optimizers.legacy.Nadam(learning_rate=1e-3, beta_1=beta_1,
                                              schedule_decay=schedule_decay)
        # One traced step instead of 1,035 eager ones (seconds instead of tens of seconds).
        @tf.function
        def step(g):
            opt.apply_gradients([(g, var)])

        for t in range(1, 1036):
            g = rng.randn(1, DIM).astype(np.float32)
            step(tf.constant(g))
            table.apply_gradients(TRAINED[:1], g, lr=1e-3, step=t)
            if t in (1, 2, 10, 100, 1024) or t > 1024:
                values, _ = table.find(TRAINED[:1])
                np.testing.assert_allclose(values, var.numpy(), rtol=RTOL, atol=ATOL,
                                           err_msg=f"step {t}")
    finally:
        table.destroy()

def test_keras_nadam_u_product_past_its_table():
    """Keras Nadam's u_product is a running float32 product; the core derives it from the step
    (exactly, from a table, up to step 1024; then in closed form). With beta_1=0.999 it is still
    ~3e-7 at step 1024, so 1 - u_product != 1 in float32 and steps past 1024 check the closed form
    against Keras' running product."""
    keras = _keras()
    import tensorflow as tf

    spec = K("nadam", beta_1=0.999)
    table, init = _preloaded_table(spec, 7)
    rng = np.random.RandomState(7)
    try:
        with tf.device("/CPU:0"):
            var = keras.Variable(init[:1].copy(), dtype="float32")
            opt = keras.optimizers.Nadam(learning_rate=1e-3, beta_1=0.999)
            opt.build([var])
            # One traced step instead of 1,030 eager ones (seconds instead of tens of seconds).
            step = tf.function(lambda g: opt.apply_gradients([(g, var)]))
            for t in range(1, 1031):
                g = rng.randn(1, DIM).astype(np.float32)
                step(tf.constant(g))
                table.apply_gradients(TRAINED[:1], g, lr=1e-3, step=t)
                if t in (1, 100, 1024) or t > 1024:
                    values, _ = table.find(TRAINED[:1])
                    np.testing.assert_allclose(values, np.asarray(var), rtol=RTOL, atol=ATOL,
                                               err_msg=f"step {t}")
    finally:
        table.destroy()


def test_adam_slots_named_like_the_frameworks():
    t = Table(dim=2, optimizer={"name": "adam", "flavor": "keras"})
    assert t.slot_names == ["momentum", "velocity"]
    t.destroy()
    t = Table(dim=2, optimizer={"name": "adam", "flavor": "optax"})
    assert t.slot_names == ["mu", "nu"]
    t.destroy()


def test_spec_string_and_canonical_defaults():
    t = Table(dim=3, optimizer='{"name": "adam", "flavor": "optax", "b1": 0.5}')  # JSON text
    try:
        assert t.describe()[1] == {"name": "adam", "flavor": "optax", "b1": 0.5, "b2": 0.999,
                                   "eps": 1e-08, "eps_root": 0.0, "nesterov": False,
                                   "amsgrad": False}
    finally:
        t.destroy()
    t = Table(dim=3, optimizer={"name": "sgd", "flavor": "keras", "momentum": 0.0})
    try:
        assert t.slot_names == []  # no momentum, no slot (as in Keras)
    finally:
        t.destroy()


def test_missing_rows_start_from_initial_slots():
    """A key first seen by apply_gradients gets its initializer row and initial slots, then the
    update: the same as a preloaded row (Adagrad's accumulator starts at 0.1 here)."""
    keras = _keras()
    spec = K("adagrad")
    t = Table(dim=DIM, initializer="zeros", optimizer=spec)
    try:
        g = np.random.RandomState(3).randn(1, DIM).astype(np.float32)
        t.apply_gradients(np.array([7], np.int64), g, lr=0.1, step=1)
        var = keras.Variable(np.zeros((1, DIM), np.float32))
        keras.optimizers.Adagrad(learning_rate=0.1).apply_gradients([(g, var)])
        values, _ = t.find(np.array([7], np.int64))
        np.testing.assert_allclose(values, np.asarray(var), rtol=RTOL, atol=ATOL)
    finally:
        t.destroy()


BAD_SPECS = [
    ({"name": "adamq", "flavor": "keras"}, "adamq"),
    ('{"name": "nosuchopt", "flavor": "optax"}', "nosuchopt"),
    ({"name": "adam", "flavor": "pytorch"}, "pytorch"),
    ('{"name": "sgd", "flavor": "jaxish"}', "jaxish"),
    ({"name": "adam", "flavor": "keras", "b1": 0.9}, "b1"),  # optax name under keras
    ({"name": "adam", "flavor": "optax", "beta_1": 0.9}, "beta_1"),  # keras name under optax
    ('{"name": "rmsprop", "flavor": "keras", "decay": 0.9}', "decay"),
    ({"name": "lion", "flavor": "keras", "weight_decay": -0.1}, "weight_decay"),
    ({"name": "sgd", "flavor": "optax", "bogus_hyper": 1}, "bogus_hyper"),
    ({"name": "adam", "flavor": "keras", "beta_1": 1.5}, "beta_1"),
    ({"name": "sgd", "flavor": "keras", "momentum": -0.1}, "momentum"),
    ({"name": "adagrad", "flavor": "optax", "eps": -1.0}, "eps"),
    ({"name": "ftrl", "flavor": "keras", "learning_rate_power": 0.5}, "learning_rate_power"),
    ({"name": "lion", "flavor": "keras", "beta_1": 0.0}, "beta_1"),
    ({"name": "adam", "flavor": "keras", "epsilon": "abc"}, "epsilon"),
    ({"name": "adam", "flavor": "keras", "amsgrad": "maybe"}, "amsgrad"),
    ({"name": "ftrl", "flavor": "optax"}, "optax"),
    ({"name": "adam", "flavor": "optax", "bias_correction_mu": False}, "bias_correction_mu"),
    ({"name": "adam", "flavor": "optax", "amsgrad": True, "nesterov": True}, "nesterov"),
]


@pytest.mark.parametrize("spec,needle", BAD_SPECS, ids=[n for _, n in BAD_SPECS])
def test_bad_spec_raises_value_error_naming_it(spec, needle):
    with pytest.raises(ValueError, match=needle):
        Table(dim=4, optimizer=spec)


@pytest.mark.parametrize("spec,needle", [
    ('{"name": "adamq", "flavor": "keras"}', "adamq"),
    ('{"name": "adam", "flavor": "pytorch"}', "pytorch"),
    ('{"name": "adam", "flavor": "keras", "b1": 0.9}', "b1"),
    ('{"flavor": "keras"}', "name"),
])
def test_core_rejects_bad_spec_itself(spec, needle):
    """The same errors come from the core, for front ends that pass spec strings straight in."""
    from dualemb.core import table as table_module

    core = table_module._core
    t = Table(dim=4)
    try:
        with pytest.raises(ValueError, match=needle):
            core.set_optimizer(t.id, spec)
    finally:
        t.destroy()


@pytest.mark.parametrize("flavor,slots", [("keras", ["momentum", "velocity", "velocity_hat"]),
                                          ("optax", ["mu", "nu", "nu_max"])])
def test_core_amsgrad_alias(flavor, slots):
    """The core also takes "name": "amsgrad" (optax.amsgrad's name); its canonical name is adam."""
    from dualemb.core import table as table_module

    t = Table(dim=4)
    try:
        table_module._core.set_optimizer(t.id, f'{{"name": "amsgrad", "flavor": "{flavor}"}}')
        opt = t.describe()[1]
        assert opt["name"] == "adam" and opt["amsgrad"] is True
        assert t.slot_names == slots
        with pytest.raises(ValueError, match="amsgrad"):
            table_module._core.set_optimizer(
                t.id, f'{{"name": "amsgrad", "flavor": "{flavor}", "amsgrad": false}}')
    finally:
        t.destroy()


def test_bad_step_or_lr_changes_nothing():
    t, init = _preloaded_table(K("adam"), 0)
    try:
        ids = np.append(TRAINED, 12345)
        g = np.ones((len(ids), DIM), np.float32)
        with pytest.raises(ValueError, match="step"):
            t.apply_gradients(ids, g, lr=0.1, step=0)
        with pytest.raises(ValueError, match="learning rate"):
            t.apply_gradients(ids, g, lr=float("nan"), step=1)
        assert t.size() == len(TRAINED) + 1
        values, slots = _export_by_key(t, np.append(TRAINED, UNTOUCHED))
        assert np.array_equal(values, init) and not slots.any()
    finally:
        t.destroy()
