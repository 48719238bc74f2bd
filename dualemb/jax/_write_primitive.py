"""The table writes' custom calls as dualemb's own JAX primitive, without a JAX effect.

``jax.ffi.ffi_call(..., has_side_effect=True)`` gives a call a JAX effect, and ``jit`` takes its
Python dispatch path for every executable with an effect instead of its C++ one: a training
step with one ``apply_gradients`` per table spent 2.2 ms of a 6.2 ms step (the demo's model)
dispatching in Python (docs/benchmarks.md, "Python dispatch of effectful steps"). A write needs
three things the effect gave it, and this primitive gives them without the effect:

* XLA keeps it although nothing may read its result: the custom call is lowered with XLA's
  ``has_side_effect`` attribute (:func:`jax.ffi.ffi_lowering`);
* JAX keeps it too: its dead-code elimination drops effect-free equations whose results are
  unused, so the primitive has a DCE rule that always keeps it (a dropped
  ``apply_gradients`` result must still update the table, as the table lives in the core);
* it runs once: rematerialisation (``jax.checkpoint``) would recompute an effect-free equation
  in the backward pass, so the primitive refuses it, as ``jax.checkpoint`` refuses the effect.

Writes are table calls, batched as the FFI's ``"expand_dims"`` (the whole batch in one call).
The CUDA handlers and the host-callback twins keep ``ffi_call`` with its effect
(:func:`dualemb.jax._ffi._call` chooses).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir
from jax.interpreters import partial_eval as pe

write_p = jex_core.Primitive("dualemb_write")
write_p.multiple_results = True


def write(target: str, results, *operands):
    """The custom call ``target`` on ``operands``, with ``results`` (ShapeDtypeStructs) out;
    kept and run once wherever it is traced (see the module's docstring)."""
    specs = tuple((tuple(r.shape), jnp.dtype(r.dtype)) for r in results)
    return write_p.bind(*operands, target=target, results=specs)


def _abstract_eval(*avals, target, results):
    del avals, target
    return [jax.core.ShapedArray(shape, dtype) for shape, dtype in results]


@functools.cache
def _jitted(target, results):
    return jax.jit(lambda *ops: write_p.bind(*ops, target=target, results=results))


def _impl(*operands, target, results):
    # Outside jit: compiled once per target and result shapes, like any primitive.
    return _jitted(target, results)(*operands)


def _lowering(ctx, *operands, target, results):
    del results
    return jax.ffi.ffi_lowering(target, has_side_effect=True)(ctx, *operands)


def _batch(args, dims, *, target, results):
    # "expand_dims": unbatched operands get a leading axis of size 1, the results one of the
    # batch's size, and the whole batch goes to one call.
    # (An unbatched operand's dim is None.)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    ops = [jnp.expand_dims(a, 0) if d is None else jnp.moveaxis(a, d, 0)
           for a, d in zip(args, dims)]
    batched = tuple(((size,) + shape, dtype) for shape, dtype in results)
    outs = write_p.bind(*ops, target=target, results=batched)
    return outs, [0] * len(outs)


def _keep(*args):
    # pe.dce_rules' signature gained an argument (live inputs) in later jax releases; the
    # equation is always the last one.
    eqn = args[-1]
    return [True] * len(eqn.invars), eqn


def _no_remat(*args, **kwargs):
    eqn = args[-1]
    raise NotImplementedError(
        f"dualemb: {eqn.params['target']} writes to a table and cannot be rematerialised "
        "(jax.checkpoint / remat would run it again in the backward pass): call it outside "
        "the checkpointed function")


write_p.def_impl(_impl)
write_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(write_p, _lowering)
batching.primitive_batchers[write_p] = _batch
pe.dce_rules[write_p] = _keep
pe.partial_eval_jaxpr_custom_rules[write_p] = _no_remat
