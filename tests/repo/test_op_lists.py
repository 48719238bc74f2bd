"""Every op is listed once, and the places generated from that list agree.

JAX: the targets of ``DUALEMB_JAX_FFI_TARGETS`` (csrc/jax/ffi_handlers.h), as the compiled
module hands them out, are exactly the handlers defined in csrc/jax/ffi_*.cc, are registered
with XLA for the CPU, each has a host-callback twin in ``dualemb.jax._host`` and a wrapper in
``dualemb.jax._ffi`` that calls it (and no wrapper calls anything else).

TensorFlow: the ops of the loaded library are the REGISTER_OPs of csrc/tf/ops.cc, each has a CPU
kernel for every key dtype its ``Tkey`` attr allows, and each has ``tf.no_gradient`` unless it
is one of ``dualemb.tf.ops.OPS_WITH_GRADIENT`` (which have a real gradient function).
"""

from __future__ import annotations

import glob
import os
import re

import pytest

import _paths

ROOT = str(_paths.ROOT)


def _source(*parts) -> str:
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


# ---- JAX ----------------------------------------------------------------------------------

def _jax_targets() -> set:
    from dualemb.jax import _ffi
    return set(_ffi._ext.registrations())


def test_jax_targets_are_the_defined_handlers():
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "jax", "*.cc")):
        with open(path) as f:
            defined |= set(re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)", f.read()))
    assert len(defined) >= 13  # the scan found the handlers
    assert _jax_targets() == defined


def _cuda_column() -> dict:
    """{target: 0 or 1} from the CUDA column of DUALEMB_JAX_FFI_TARGETS (ffi_handlers.h)."""
    text = _source("csrc", "jax", "ffi_handlers.h")
    block = text[text.index("#define DUALEMB_JAX_FFI_TARGETS(X)"):]
    block = block[:block.index("\n\n")]
    return {"dualemb_" + n: int(c) for n, c in re.findall(r"X\((\w+),\s*([01])\)", block)}


def test_cuda_handlers_are_the_entries_marked_in_the_one_list():
    # The CUDA-platform handlers (csrc/jax/cuda, module dualemb._jax_ffi_cuda) are the list's
    # entries marked 1, each defined as dualemb_<name>_cuda; the list names every target once.
    column = _cuda_column()
    assert set(column) == _jax_targets()
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "jax", "cuda", "*.cc")):
        with open(path) as f:
            defined |= set(re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)", f.read()))
    marked = {name + "_cuda" for name, c in column.items() if c == 1}
    assert len(marked) >= 3
    assert defined == marked
    # A built CUDA module hands out exactly the marked targets.
    try:
        from dualemb._native import load_extension
        ext = load_extension("_jax_ffi_cuda")
    except ImportError:
        return  # built without the GPU table (no nvcc): nothing more to compare
    assert set(ext.registrations()) == {n for n, c in column.items() if c == 1}


def test_jax_targets_are_registered_with_xla_for_the_cpu():
    import jax
    from jax._src.lib import xla_client
    if not hasattr(xla_client, "custom_call_targets"):
        pytest.skip("this jaxlib does not list its custom call targets")
    _jax_targets()  # imports dualemb.jax, which registers them
    jax.devices("cpu")  # registrations made before the backend starts are handed over here
    registered = {t for t in xla_client.custom_call_targets("cpu") if t.startswith("dualemb_")}
    assert registered == _jax_targets()


def test_every_jax_target_has_a_host_twin_and_a_wrapper():
    from dualemb.jax import _ffi, _host
    targets = _jax_targets()
    assert set(_host.TWINS) == targets
    assert set(_ffi._HOST_FNS) == targets
    for name, fn in _ffi._HOST_FNS.items():
        assert fn is _host.TWINS[name] and name == "dualemb_" + fn.__name__
    called = set(re.findall(r'_call\(\s*"(dualemb_\w+)"', _source("dualemb", "jax", "_ffi.py")))
    assert called == targets


def test_a_target_without_a_twin_fails_the_import_naming_it():
    from dualemb.jax import _ffi
    targets = _jax_targets()
    with pytest.raises(ImportError, match=r"without a host twin \['dualemb_new_op'\]"):
        _ffi._host_twins(targets | {"dualemb_new_op"})
    with pytest.raises(ImportError, match=r"host twins without an FFI target \['dualemb_find'\]"):
        _ffi._host_twins(targets - {"dualemb_find"})
    assert set(_ffi._host_twins(targets)) == targets


# ---- TensorFlow ---------------------------------------------------------------------------

def _tf_ops():
    from dualemb.tf import ops
    return ops


def test_tf_op_library_holds_the_ops_of_ops_cc():
    declared = set(re.findall(r'REGISTER_OP\("(\w+)"\)', _source("csrc", "tf", "ops.cc")))
    assert len(declared) >= 20
    assert set(_tf_ops().OP_NAMES) == declared


def test_every_tf_op_has_a_cpu_kernel_for_each_key_dtype():
    import tensorflow as tf
    from tensorflow.python.framework import kernels, op_def_registry

    checked = 0
    for name in _tf_ops().OP_NAMES:
        op_def = op_def_registry.get(name)
        cpu = [k for k in kernels.get_registered_kernels_for_op(name).kernel
               if k.device_type == "CPU"]
        assert cpu, f"{name} has no CPU kernel"
        attrs = {a.name: a for a in op_def.attr}
        if "Tkey" not in attrs:
            continue
        allowed = list(attrs["Tkey"].allowed_values.list.type)
        assert {tf.as_dtype(t) for t in allowed} == {tf.int32, tf.int64, tf.string}, name
        for t in allowed:
            covered = any(
                all(c.name != "Tkey" or t in c.allowed_values.list.type for c in k.constraint)
                for k in cpu)
            assert covered, f"{name} has no CPU kernel for Tkey={tf.as_dtype(t).name}"
            checked += 1
    assert checked >= 30  # 11 keyed ops x 3 key dtypes


def test_tf_ops_have_no_gradient_unless_they_have_one():
    from tensorflow.python.framework import ops as tf_framework_ops

    import dualemb.tf  # noqa: F401  (registers the gradients of OPS_WITH_GRADIENT)
    ops = _tf_ops()
    assert ops.OPS_WITH_GRADIENT <= set(ops.OP_NAMES)
    for name in ops.OP_NAMES:
        grad = tf_framework_ops._gradient_registry.lookup(name)  # LookupError: none registered
        if name in ops.OPS_WITH_GRADIENT:
            assert callable(grad), name
        else:  # tf.no_gradient registers None (DualembAccumRows was once left out)
            assert grad is None, f"{name} has a gradient function but is not listed as having one"

