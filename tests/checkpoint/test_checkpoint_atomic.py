"""Restoring several tables is all or nothing, on every path (issue 9, item 9).

docs/checkpoint_format.md: a bad checkpoint never modifies a live table. With several tables
that means every table (manifest entry, dim, dtypes, optimizer, every checksum of every shard)
is verified before the first one is written. Each test makes the *second* (or any one) table of
a restore bad, expects an error, and compares byte for byte the exports of *every* live table
(keys, rows, slots, per-key metadata) with what they held before.
"""

import json
import os

import jax
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from dualemb.core import checkpoint as core_ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.table import Table as CoreTable

DIM = 4


def _snapshot(core_tables):
    """Everything a table (or list of shards) holds, sorted by key, as bytes per field."""
    parts = [t.export() for t in core_tables]
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(out["keys"], kind="stable")
    return {k: v[order].tobytes() for k, v in out.items()}


def _flip_byte(ckdir, table_name):
    """Flips one bit inside the values tensor of the table's first shard file."""
    with open(os.path.join(ckdir, "manifest.json")) as f:
        manifest = json.load(f)
    (entry,) = [t for t in manifest["tables"] if t["name"] == table_name]
    shard = entry["shards"][0]
    offset = shard["header_bytes"] + shard["tensors"]["values"]["data_offsets"][0] + 5
    path = os.path.join(ckdir, shard["file"])
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


# ---- JAX: dej.load_tables and the Orbax handler ------------------------------------------------

def _jax_table(dim, seed, n, opt=None):
    t = dej.create(dim, initializer=dej.initializers.normal(0.0, 1.0, seed=seed),
                   optimizer=opt or dej.optimizers.adam(0.1))
    ids = dej.ids(np.arange(n, dtype=np.int64) * 7 + seed)
    g = np.random.RandomState(seed).randn(n, dim).astype(np.float32)
    return jax.jit(dej.apply_gradients)(t, ids, g)


def _jax_snapshot(tables):
    return [_snapshot([t.core()]) for t in tables]


def _save_two(ckdir, bad, via_orbax):
    """Saves tables "a" and "b" (b of another dim when bad == "wrong dim") and corrupts b's
    shard when bad == "flipped byte"; returns the directory holding the dualemb checkpoint."""
    a = _jax_table(DIM, 1, 30)
    b = _jax_table(DIM + 2 if bad == "wrong dim" else DIM, 2, 25)
    if via_orbax:
        ocp = pytest.importorskip("orbax.checkpoint")
        from dualemb.jax import orbax as deo
        with ocp.CheckpointManager(ckdir) as mngr:
            mngr.save(1, args=ocp.args.Composite(tables=deo.TablesSave({"a": a, "b": b})))
            mngr.wait_until_finished()
        path = os.path.join(ckdir, "1", "tables", "dualemb")
    else:
        dej.save({"a": a, "b": b}, ckdir)
        path = str(ckdir)
    if bad == "flipped byte":
        _flip_byte(path, "b")
    dej.destroy(a)
    dej.destroy(b)
    return path


def _restore_orbax(ckdir, live):
    ocp = pytest.importorskip("orbax.checkpoint")
    from dualemb.jax import orbax as deo
    with ocp.CheckpointManager(ckdir) as mngr:
        return mngr.restore(1, args=ocp.args.Composite(tables=deo.TablesRestore(live))).tables


@pytest.mark.parametrize("bad", ["wrong dim", "flipped byte"])
@pytest.mark.parametrize("via", ["orbax", "load_tables"])
def test_jax_restore_of_two_tables_with_a_bad_second_changes_neither(tmp_path, bad, via):
    path = _save_two(tmp_path / "ck", bad, via_orbax=via == "orbax")
    live = {"a": _jax_table(DIM, 5, 7), "b": _jax_table(DIM, 6, 9)}
    before = _jax_snapshot(live.values())
    message = "dim mismatch" if bad == "wrong dim" else "checksum mismatch"
    with pytest.raises(CheckpointError, match=message):
        if via == "orbax":
            _restore_orbax(tmp_path / "ck", live)
        else:
            dej.load_tables(path, into=live)
    assert _jax_snapshot(live.values()) == before
    for t in live.values():
        dej.destroy(t)


def test_jax_load_tables_restores_every_table(tmp_path):
    a, b = _jax_table(DIM, 1, 30), _jax_table(DIM + 2, 2, 25)
    dej.save({"a": a, "b": b}, tmp_path / "ck")
    saved = _jax_snapshot([a, b])
    live = {"a": _jax_table(DIM, 5, 7), "b": _jax_table(DIM + 2, 6, 9)}
    got = dej.load_tables(tmp_path / "ck", into=live)
    assert got["a"].id == live["a"].id and got["b"].id == live["b"].id
    assert _jax_snapshot([got["a"], got["b"]]) == saved
    fresh = dej.load_tables(tmp_path / "ck", ["b"])
    assert list(fresh) == ["b"] and _jax_snapshot([fresh["b"]]) == saved[1:]
    for t in (a, b, got["a"], got["b"], fresh["b"]):
        dej.destroy(t)


def test_generic_state_that_does_not_fit_is_refused_before_the_live_table_changes(tmp_path):
    # Saved with Adam on the generic path (two state rows); restored with SGD momentum (one):
    # the misfit was found only after the live table had been overwritten.
    saved = _jax_table(DIM, 1, 30, opt=optax.adam(0.1))
    dej.save({"a": saved}, tmp_path / "ck")
    live = _jax_table(DIM, 5, 7, opt=optax.sgd(0.1, momentum=0.9))
    before = _jax_snapshot([live])
    with pytest.raises(CheckpointError, match="does not fit"):
        dej.load(tmp_path / "ck", "a", into=live)
    assert _jax_snapshot([live]) == before
    dej.destroy(saved)
    dej.destroy(live)


def test_the_same_live_table_for_two_saved_tables_is_refused(tmp_path):
    a, b = _jax_table(DIM, 1, 30), _jax_table(DIM, 2, 25)
    dej.save({"a": a, "b": b}, tmp_path / "ck")
    live = _jax_table(DIM, 5, 7)
    before = _jax_snapshot([live])
    with pytest.raises(CheckpointError, match="more than once"):
        dej.load_tables(tmp_path / "ck", into={"a": live, "b": live})
    assert _jax_snapshot([live]) == before


# ---- dualemb.core.checkpoint -------------------------------------------------------------------

def _core_table(dim, seed, n):
    t = CoreTable(dim=dim, optimizer={"name": "adagrad", "flavor": "optax"})
    rng = np.random.default_rng(seed)
    keys = rng.choice(10_000, n, replace=False).astype(np.int64)
    t.apply_gradients(keys, rng.standard_normal((n, dim)).astype(np.float32), lr=0.1, step=1)
    return t


def _odd_even(keys, n):
    return (keys % 2 == 1).astype(np.int64) % n


@pytest.mark.parametrize("bad_table", ["a", "b"])
def test_core_load_with_a_partitioner_per_table_is_verified_as_a_whole(tmp_path, bad_table):
    core_ckpt.save(tmp_path / "ck", {"a": _core_table(DIM, 1, 50), "b": _core_table(DIM, 2, 40)})
    _flip_byte(str(tmp_path / "ck"), bad_table)
    live_a = [_core_table(DIM, 3, 5), _core_table(DIM, 4, 6)]
    live_b = [_core_table(DIM, 5, 7)]
    before = [_snapshot(live_a), _snapshot(live_b)]
    with pytest.raises(CheckpointError, match=f"table '{bad_table}'"):
        core_ckpt.load(tmp_path / "ck", {"a": live_a, "b": live_b},
                       partitioner={"a": _odd_even})
    assert [_snapshot(live_a), _snapshot(live_b)] == before


def test_core_load_routes_each_table_with_its_own_partitioner(tmp_path):
    a, b = _core_table(DIM, 1, 50), _core_table(DIM, 2, 40)
    core_ckpt.save(tmp_path / "ck", {"a": a, "b": b})
    live_a, live_b = [CoreTable(DIM), CoreTable(DIM)], [CoreTable(DIM), CoreTable(DIM)]
    core_ckpt.load(tmp_path / "ck", {"a": live_a, "b": live_b}, partitioner={"a": _odd_even})
    for shards, route in ((live_a, _odd_even), (live_b, lambda k, n: np.mod(k, n))):
        for i, s in enumerate(shards):
            keys = s.export()["keys"]
            assert len(keys) and (route(keys, 2) == i).all()
    assert _snapshot(live_a) == _snapshot([a]) and _snapshot(live_b) == _snapshot([b])


def test_core_load_refuses_one_live_table_for_two_saved_tables(tmp_path):
    core_ckpt.save(tmp_path / "ck", {"a": _core_table(DIM, 1, 50), "b": _core_table(DIM, 2, 40)})
    live = _core_table(DIM, 3, 5)
    before = _snapshot([live])
    with pytest.raises(CheckpointError, match="more than once"):
        core_ckpt.load(tmp_path / "ck", {"a": live, "b": [live]})
    with pytest.raises(CheckpointError, match="more than once"):
        core_ckpt.load(tmp_path / "ck", {"a": [live, live]})
    assert _snapshot([live]) == before


# ---- TF: de.load ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad_table", ["a", "b"])
def test_de_load_of_variables_sharded_differently_changes_none_on_a_bad_table(tmp_path,
                                                                             bad_table):
    tf = pytest.importorskip("tensorflow")
    from dualemb.tf import saving
    from dualemb.tf.variable import Variable

    def variable(name, shards, seed):
        v = Variable(dim=DIM, devices=["/CPU:0"] * shards, name=name,
                     initializer=tf.keras.initializers.RandomNormal(seed=seed))
        v.upsert(tf.constant(np.arange(20, dtype=np.int64) * 3 + seed),
                 tf.random.stateless_normal([20, DIM], seed=[seed, 0]))
        return v

    def shards_of(v):
        return [CoreTable.attach(t.table_id) for t in v.tables]

    # "a" has 2 shards, "b" 1: different partitioners, which de.load used to restore in two
    # separate core loads (the first one written before the second was verified).
    saved = {"a": variable("a", 2, 1), "b": variable("b", 1, 2)}
    saving.save(saved, tmp_path / "ck")
    _flip_byte(str(tmp_path / "ck"), bad_table)
    live = {"a": variable("a", 2, 3), "b": variable("b", 1, 4)}
    before = [_snapshot(shards_of(v)) for v in live.values()]
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        saving.load(live, tmp_path / "ck")
    assert [_snapshot(shards_of(v)) for v in live.values()] == before
