"""How this process's XLA evaluates Optax's bias correction, for the Optax parity tests.

Optax divides a moment by its bias correction (``mu / (1 - b1**t)``, in a jitted helper). XLA up
to jax 0.12.0 evaluated that as ``mu * (1 / (1 - b1**t))`` with ``b1**t`` rounded once, and the
core's Optax kernels do the same, so their results equal Optax's bit for bit there. From jax
0.12.1 XLA divides, which rounds differently in the last bit of about half the elements
(measured: optax.adamax's first step, 177 of 350 bias-corrected moments), and rounds ``b1**t``
differently at some steps (optax.adam's rows differ from step 3). The core's Keras kernels are
not concerned.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def xla_divides_by_scalar() -> bool:
    """True where jit(t / (1 - 0.9**c)) rounds as a true division, False where it rounds as a
    multiplication by the reciprocal (a fixed sample, on the CPU)."""
    import jax
    import jax.numpy as jnp

    t = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        got = np.asarray(jax.jit(lambda t, c: t / (1 - 0.9 ** c))(jnp.asarray(t),
                                                                  jnp.asarray(1, jnp.int32)))
    bc = np.float32(1) - np.float32(0.9)
    divided, by_reciprocal = t / bc, t * (np.float32(1) / bc)
    assert not np.array_equal(divided, by_reciprocal)  # the sample tells the two apart
    if np.array_equal(got, divided):
        return True
    if np.array_equal(got, by_reciprocal):
        return False
    raise AssertionError("XLA's t / (1 - 0.9**c) is neither a division nor a multiplication by "
                         "the reciprocal")


def _bias_correction_by_reciprocal(moment, decay, count):
    # optax.tree.bias_correction as older XLA evaluated it: the moment times 1 / (1 - decay**t),
    # decay**t rounded once from float32 decay (XLA 0.12.1 also rounds its power differently:
    # one ulp of 1 - 0.999**3 is 2e-5 of it). The parity tests run Optax op by op, so count is
    # a concrete value here.
    import jax

    power = np.float32(np.power(np.float64(np.float32(decay)), np.float64(np.asarray(count))))
    inv = np.float32(1) / (np.float32(1) - power)
    return jax.tree.map(lambda t: t * inv.astype(t.dtype), moment)


def optax_rounds_as_the_core(monkeypatch) -> bool:
    """Where XLA divides by a scalar exactly, has Optax (for this test, through ``monkeypatch``)
    divide its moments by their bias correction as a multiplication by the reciprocal, as the
    core's kernels and older XLA do, so that the parity tests still compare bit for bit, and
    returns True; elsewhere changes nothing and returns False. What it changes is the rounding of
    that one operation; the callers also check the core against the unchanged Optax, within
    float32 tolerance."""
    if not xla_divides_by_scalar():
        return False
    import optax

    monkeypatch.setattr(optax.tree, "bias_correction", _bias_correction_by_reciprocal)
    return True
