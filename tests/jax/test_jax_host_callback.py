"""The host-callback lowering (platforms without the native FFI handler: GPU, TPU), forced on CPU
with DUALEMB_JAX_HOST_CALLBACK=1 and compared with the FFI path bit for bit: the single-device
API (tests/jax/jax_host_callback_worker.py), the sharded path with 2 devices and with 2 processes
(tests/jax/jax_scale_worker.py --callback), and its errors. The variable is read when dualemb.jax is
imported, so every case runs in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import _scale_util as U

WORKER = os.path.join(os.path.dirname(U.WORKER), "jax_host_callback_worker.py")


def env(callback: bool, devices: int = 1) -> dict:
    e = U.env(devices)
    e["DUALEMB_JAX_HOST_CALLBACK"] = "1" if callback else "0"
    return e


def run_worker(tmp_path, callback: bool) -> dict:
    out = tmp_path / f"callback{int(callback)}.npz"
    r = subprocess.run([sys.executable, WORKER, str(out)], env=env(callback),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(np.load(out))


def test_single_device_api_equals_the_ffi_bit_for_bit(tmp_path):
    ffi, host = run_worker(tmp_path, False), run_worker(tmp_path, True)
    assert not ffi.pop("host_callback") and host.pop("host_callback")
    assert sorted(ffi) == sorted(host)
    assert len(ffi) > 40  # adam+grad+jit, export, vmap, writes, int32, generic Optax
    for k in ffi:
        assert ffi[k].dtype == host[k].dtype and ffi[k].shape == host[k].shape, k
        assert ffi[k].tobytes() == host[k].tobytes(), k  # bit for bit (NaN-safe)
    # Not vacuous: the tables were trained and written.
    assert int(ffi["adam.step"]) == 5 and len(ffi["adam.keys"]) == 7
    assert ffi["writes.5"].tolist() == [True, False, True, False, True, False, True, False, False]


@pytest.mark.parametrize("processes,devices", [(1, 2), (2, 1)])
def test_sharded_path_equals_the_ffi_bit_for_bit(tmp_path, processes, devices):
    states = {}
    for callback in (False, True):
        d = tmp_path / f"cb{int(callback)}"
        d.mkdir()
        args = ["--unique-per-device", "--steps", "3"] + (["--callback"] if callback else [])
        U.check_ok(U.run_processes(d, processes, args, devices=devices,
                                   extra_env={"DUALEMB_JAX_HOST_CALLBACK": str(int(callback))}))
        states[callback] = U.load_state(d, processes)
    ffi, host = states[False], states[True]
    assert len(ffi["keys"]) > 50 and ffi["step"] == host["step"] == 3
    for k in ("keys", "values", "slots"):
        np.testing.assert_array_equal(host[k], ffi[k], err_msg=k)


ERRORS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh
    import dualemb.jax as dej
    from dualemb.jax import _ffi, sharded
    assert _ffi.uses_host_callback()

    def fails(fn, *needles):
        try:
            jax.block_until_ready(fn())
        except Exception as e:
            for n in needles:
                assert n in str(e), (n, str(e)[-2000:])
        else:
            raise AssertionError(f"no error; expected {needles}")

    t = dej.create(4, optimizer=dej.optimizers.adam(0.1))
    ids = dej.ids(np.array([1, 2, 3]))
    step = jax.jit(dej.apply_gradients)
    t = step(t, ids, jnp.ones((3, 4)))
    before = t.core().export(0, 100)

    # A corrupted handle (e.g. weight decay on a pytree holding the table) is refused.
    leaves, treedef = jax.tree_util.tree_flatten(t)
    bad = jax.tree_util.tree_unflatten(treedef, [leaves[0] + 0.5] + leaves[1:])
    fails(lambda: step(bad, ids, jnp.ones((3, 4))), "corrupted table handle")
    # int64 ids that do not fit an int32 table are refused, not truncated.
    t32 = dej.create(4, key_dtype="int32")
    # (the low-level call: dualemb.jax.ops would refuse these ids before it)
    pairs = jnp.asarray(np.array([2**40], np.int64).view(np.uint32).reshape(1, 2))
    fails(lambda: jax.jit(lambda t, k: _ffi.insert_or_assign(t.handle, t.version, k,
                                                             jnp.ones((1, 4))))(t32, pairs),
          "key 1099511627776 does not fit the table's int32 key dtype")
    assert int(dej.size(t32)) == 0
    after = t.core().export(0, 100)
    for k in ("keys", "values", "slots"):
        np.testing.assert_array_equal(after[k], before[k])

    # A destroyed table: a clear error when the compiled call runs, and no crash.
    dej.destroy(t)
    fails(lambda: step(t, ids, jnp.ones((3, 4))), "unknown table id")
    fails(lambda: jax.jit(dej.lookup)(t, ids), "unknown table id")

    # The sharded exchange over capacity fails naming the knob, nothing written.
    mesh = Mesh(np.array(jax.devices()), ("x",))
    st = sharded.create(mesh, 4, optimizer=dej.optimizers.sgd(0.5), capacity_per_shard=2)
    fails(lambda: jax.jit(sharded.apply_gradients)(
        st, dej.ids(np.array([0, 2, 4, 6, 1, 3, 5, 7])), jnp.ones((8, 4))),
        "capacity_per_shard=2", "4 distinct ids")
    assert all(int(dej.size(x)) == 0 for x in st.local_tables().values())

    # The process is fine afterwards.
    u = dej.create(4)
    u = jax.jit(dej.insert)(u, ids, jnp.ones((3, 4)))
    np.testing.assert_array_equal(dej.lookup(u, ids), np.ones((3, 4)))
    print("OK")
""")


def test_errors_on_the_host_callback_path_are_clear_and_write_nothing():
    r = subprocess.run([sys.executable, "-c", ERRORS], env=env(True, devices=2),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr[-4000:]


def test_bad_switch_value_is_refused_at_import():
    e = env(True)
    e["DUALEMB_JAX_HOST_CALLBACK"] = "yes"
    r = subprocess.run([sys.executable, "-c", "import dualemb.jax"], env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "DUALEMB_JAX_HOST_CALLBACK must be 0, 1 or unset" in r.stderr


def test_a_platform_without_the_native_handler_uses_the_callback(monkeypatch):
    from dualemb.jax import _ffi
    monkeypatch.setattr(_ffi, "_FORCED", "")
    for backend, host in (("cpu", False), ("gpu", True), ("tpu", True)):
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert _ffi.uses_host_callback() is host, backend
