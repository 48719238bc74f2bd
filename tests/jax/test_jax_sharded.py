"""Sharded tables in one process with 2 and 4 (host) devices: training equals the single-device
table on the same global batches; an exchange over capacity fails naming the knob; a replicated
table under sharded inputs trains like the single-device one.

The device count must be set before jax is imported, so each case runs in a subprocess
(tests/jax/jax_scale_worker.py, or a small script here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _scale_util as U


def reference(tmp_path, extra=(), devices=1):
    """The single-device table trained on the same global batches (`devices`: how the batches
    are drawn when they are unique per device)."""
    ref = tmp_path / "ref"
    ref.mkdir()
    U.check_ok(U.run_processes(ref, 1, ["--reference", *extra],
                               extra_env={"WORKER_DRAW": str(devices)}))
    return U.load_state(ref, 1)


def assert_same_state(got, want, exact: bool):
    np.testing.assert_array_equal(got["keys"], want["keys"])
    assert got["step"] == want["step"]
    for field in ("values", "slots"):
        if exact:
            np.testing.assert_array_equal(got[field], want[field], err_msg=field)
        else:
            # Repeated ids' gradients are summed per device, then across devices: float32
            # re-association, a few ulps per step.
            np.testing.assert_allclose(got[field], want[field], rtol=1e-5, atol=1e-6,
                                       err_msg=field)


@pytest.mark.parametrize("devices", [2, 4])
def test_sharded_training_equals_single_device_bit_for_bit(tmp_path, devices):
    # No id repeats within one device's batch: every sum associates as on one device.
    extra = ["--unique-per-device", "--steps", "4"]
    want = reference(tmp_path, extra, devices)
    U.check_ok(U.run_processes(tmp_path, 1, extra, devices=devices))
    got = U.load_state(tmp_path, 1)
    assert len(got["keys"]) > 50
    assert_same_state(got, want, exact=True)


@pytest.mark.parametrize("devices", [2, 4])
def test_sharded_training_with_repeated_ids(tmp_path, devices):
    want = reference(tmp_path, ["--steps", "4"])
    U.check_ok(U.run_processes(tmp_path, 1, ["--steps", "4"], devices=devices))
    assert_same_state(U.load_state(tmp_path, 1), want, exact=False)


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import dualemb.jax as dej
    from dualemb.jax import _ffi, sharded
    mesh = Mesh(np.array(jax.devices()), ("x",))
    assert mesh.devices.size == 2
""")


def run_script(body: str) -> str:
    r = subprocess.run([sys.executable, "-c", SCRIPT + textwrap.dedent(body)],
                       env=U.env(2), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_exchange_overflow_raises_naming_the_knob_and_writes_nothing():
    out = run_script("""
        st = sharded.create(mesh, 4, optimizer=dej.optimizers.sgd(0.5), capacity_per_shard=2)
        ok = np.array([0, 1, 2, 3, 4, 5, 6, 7])        # 2 per destination on each device
        bad = np.array([0, 2, 4, 6, 1, 3, 5, 7])       # device 0 sends 4 ids to shard 0
        g = jnp.ones((8, 4))
        step = jax.jit(sharded.apply_gradients)
        st = step(st, dej.ids(ok), g)
        before = {d: t.core().export(0, 100) for d, t in st.local_tables().items()}
        for fn, args in ((jax.jit(sharded.lookup), (st, dej.ids(bad))),
                         (step, (st, dej.ids(bad), g))):
            try:
                jax.block_until_ready(fn(*args))
            except Exception as e:
                assert "capacity_per_shard=2" in str(e), e
                assert "4 distinct ids" in str(e), e
            else:
                raise AssertionError("no error")
        for d, t in st.local_tables().items():
            after = t.core().export(0, 100)
            np.testing.assert_array_equal(after["values"], before[d]["values"])
        print("OK")
    """)
    assert "OK" in out


def test_replicated_table_under_sharded_inputs():
    out = run_script("""
        init = dej.initializers.normal(0.0, 0.1, seed=3)
        t = dej.create(4, optimizer=dej.optimizers.adam(0.1), initializer=init)
        ref = dej.create(4, optimizer=dej.optimizers.adam(0.1), initializer=init)
        data = NamedSharding(mesh, P("x"))
        rng = np.random.default_rng(0)

        # The plain single-device write: the FFI call cannot be partitioned (XLA's error, kept
        # documented); the host callback (dualemb.jax._ffi) is placed on one device and works.
        scratch = dej.create(4, optimizer=dej.optimizers.adam(0.1), initializer=init)
        plain = jax.jit(dej.apply_gradients)
        try:
            out = plain(scratch, jax.device_put(dej.ids(np.arange(8)), data),
                        jax.device_put(jnp.ones((8, 4)), data))
        except Exception as e:
            assert not _ffi.uses_host_callback(), e
            assert "Side-effect HLO must have sharding" in str(e), e
        else:
            assert _ffi.uses_host_callback()
            one = dej.apply_gradients(dej.create(4, optimizer=dej.optimizers.adam(0.1),
                                                 initializer=init),
                                      dej.ids(np.arange(8)), jnp.ones((8, 4)))
            np.testing.assert_array_equal(dej.lookup(out, dej.ids(np.arange(8))),
                                          dej.lookup(one, dej.ids(np.arange(8))))

        @jax.jit
        def step(t, ids, g):
            t = sharded.apply_gradients_replicated(t, ids, g * dej.lookup(t, ids), mesh=mesh)
            return t, dej.lookup(t, ids)

        @jax.jit
        def step1(t, ids, g):
            t = dej.apply_gradients(t, ids, g * dej.lookup(t, ids))
            return t, dej.lookup(t, ids)

        for _ in range(3):
            ids = rng.integers(0, 10, size=8)
            g = rng.normal(size=(8, 4)).astype(np.float32)
            t, a = step(t, jax.device_put(dej.ids(ids), data), jax.device_put(g, data))
            ref, b = step1(ref, dej.ids(ids), g)
            np.testing.assert_array_equal(a, b)
        assert int(t.step) == int(ref.step) == 3
        ea, eb = t.core().export(0, 100), ref.core().export(0, 100)
        for k in ("keys", "values", "slots"):
            np.testing.assert_array_equal(ea[k], eb[k])
        print("OK")
    """)
    assert "OK" in out


def test_sharded_arguments_are_checked():
    out = run_script("""
        st = sharded.create(mesh, 4, optimizer=dej.optimizers.sgd(0.5))
        for bad, exc in ((lambda: sharded.lookup(st, dej.ids(np.arange(3))), ValueError),
                         (lambda: sharded.apply_gradients(st, dej.ids(np.arange(4)),
                                                          jnp.ones((4, 3))), ValueError),
                         (lambda: sharded.create(mesh, 4, capacity_per_shard=0), ValueError),
                         (lambda: sharded.create(mesh, 4, optimizer=__import__("optax").sgd(1.)),
                          TypeError)):
            try:
                bad()
            except exc as e:
                print(type(e).__name__, e)
            else:
                raise AssertionError("accepted")
        print("OK")
    """)
    assert "OK" in out
