"""Orbax CheckpointManager policies on dualemb tables: keep the last N, keep the best N by a
metric, an injected learning rate carried through a save and restore, and async checkpointing
(the save returns while the tables are written; they hold the state of the save call; a failed
table write fails the step instead of finalizing it without its tables).

The reference for each restored step is a numpy snapshot of the table taken right after that
step (rows and optimizer slots of every id, sorted by id), compared exactly.
"""

import threading

import jax
import numpy as np
import pytest

import dualemb.jax as dej

ocp = pytest.importorskip("orbax.checkpoint")
from dualemb.jax import orbax as deo  # noqa: E402

DIM = 4
KEYS = np.array([3, 2**40 + 5, -7, 11], np.int64)


def _snapshot(table):
    """(ids, rows, slots) of every id in the table, sorted by id; the step count."""
    keys, values, slots, count = dej.export(table, 64, with_slots=True)
    n = int(count)
    ids = keys.numpy()[:n] if hasattr(keys, "numpy") else np.asarray(keys)[:n]
    order = np.argsort(ids)
    return (ids[order], np.asarray(values)[:n][order], np.asarray(slots)[:n][order],
            int(table.step))


def _assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _train(table, step_fn, seed):
    g = np.random.RandomState(seed).randn(len(KEYS), DIM).astype(np.float32)
    return step_fn(table, dej.ids(KEYS), g)


def _save(mngr, step, table, dense, metrics=None):
    return mngr.save(step, metrics=metrics, args=ocp.args.Composite(
        dense=ocp.args.StandardSave(dense), tables=deo.TablesSave({"emb": table})))


def _restore(mngr, step, into, dense_like):
    return mngr.restore(step, args=ocp.args.Composite(
        dense=ocp.args.StandardRestore(dense_like), tables=deo.TablesRestore({"emb": into})))


def test_max_to_keep_deletes_old_steps_and_each_kept_step_restores_its_rows(tmp_path):
    table = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=1),
                       optimizer=dej.optimizers.adam(0.1))
    step_fn = jax.jit(dej.apply_gradients)
    snaps = {}
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "ck", options=options) as mngr:
        for step in range(1, 5):
            table = _train(table, step_fn, step)
            snaps[step] = _snapshot(table)
            _save(mngr, step, table, {"w": np.full((2,), step, np.float32)})
        mngr.wait_until_finished()
        assert mngr.all_steps() == [3, 4]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["3", "4"]
    live = dej.create(DIM, optimizer=dej.optimizers.adam(0.1))
    with ocp.CheckpointManager(tmp_path / "ck", options=options) as mngr:
        for step in (3, 4):
            restored = _restore(mngr, step, live, {"w": np.zeros((2,), np.float32)})
            t = restored.tables["emb"]
            assert t.id == live.id  # restored into the live table (compiled steps stay valid)
            _assert_same(_snapshot(t), snaps[step])
            np.testing.assert_array_equal(restored.dense["w"], np.full((2,), step))
    # Training continues from a restored step exactly as it did the first time.
    again = _train(t, step_fn, 5)
    first = _train(table, step_fn, 5)
    _assert_same(_snapshot(again)[1:], _snapshot(first)[1:])
    for x in (table, live):
        dej.destroy(x)


def test_best_fn_keeps_the_best_steps_by_metric_and_restores_the_best(tmp_path):
    table = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=2),
                       optimizer=dej.optimizers.adagrad(0.1))
    step_fn = jax.jit(dej.apply_gradients)
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 2.0, 5: 3.0}
    snaps = {}
    options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["loss"],
                                           best_mode="min")
    with ocp.CheckpointManager(tmp_path / "best", options=options) as mngr:
        for step, loss in losses.items():
            table = _train(table, step_fn, step)
            snaps[step] = _snapshot(table)
            _save(mngr, step, table, {"w": np.zeros((1,), np.float32)}, {"loss": loss})
        mngr.wait_until_finished()
        assert sorted(mngr.all_steps()) == [2, 4]
        assert mngr.best_step() == 2
        live = dej.create(DIM, optimizer=dej.optimizers.adagrad(0.1))
        restored = _restore(mngr, mngr.best_step(), live, {"w": np.zeros((1,), np.float32)})
    _assert_same(_snapshot(restored.tables["emb"]), snaps[2])
    assert not np.array_equal(snaps[2][1], snaps[5][1])  # the best is not simply the latest
    for x in (table, live):
        dej.destroy(x)


def test_an_injected_learning_rate_is_saved_and_set_again_on_restore(tmp_path):
    opt = dej.optimizers.inject_hyperparams(dej.optimizers.adam)(learning_rate=0.1)
    table = dej.create(DIM, optimizer=opt)
    table = dej.optimizers.set_hyperparams(table, learning_rate=0.003)
    table = dej.apply_gradients(table, dej.ids(KEYS), np.ones((len(KEYS), DIM), np.float32))
    with ocp.CheckpointManager(tmp_path / "inj") as mngr:
        _save(mngr, 1, table, {"w": np.zeros((1,), np.float32)})
        mngr.wait_until_finished()
        fresh = dej.create(DIM, optimizer=opt)  # starts at 0.1
        restored = _restore(mngr, 1, fresh, {"w": np.zeros((1,), np.float32)})
    t = restored.tables["emb"]
    assert float(dej.optimizers.hyperparams(t)["learning_rate"]) == np.float32(0.003)
    _assert_same(_snapshot(t), _snapshot(table))
    for x in (table, fresh):
        dej.destroy(x)


def _held_writer(monkeypatch, fail=None):
    """Makes the handler's table writer wait until the returned event is set (then write, or
    raise ``fail``); ``started`` is set when the writer is reached."""
    started, release = threading.Event(), threading.Event()
    write = deo._write_tables

    def held(*args, **kwargs):
        started.set()
        assert release.wait(60), "the held table write was never released"
        if fail is not None:
            raise fail
        return write(*args, **kwargs)

    monkeypatch.setattr(deo, "_write_tables", held)
    return started, release


def test_async_save_returns_at_once_and_writes_the_tables_as_of_the_call(tmp_path, monkeypatch):
    table = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3),
                       optimizer=dej.optimizers.adam(0.1))
    step_fn = jax.jit(dej.apply_gradients)
    table = _train(table, step_fn, 1)
    at_save = _snapshot(table)
    started, release = _held_writer(monkeypatch)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path / "async", options=options) as mngr:
        _save(mngr, 1, table, {"w": np.ones((2,), np.float32)})  # returns: the write is held
        for step in (2, 3):  # training goes on while the save is in flight
            table = _train(table, step_fn, step)
        assert started.wait(60)
        assert not (tmp_path / "async" / "1").exists()  # not finalized without its tables
        release.set()
        mngr.wait_until_finished()
        assert mngr.all_steps() == [1] and (tmp_path / "async" / "1").is_dir()
        live = dej.create(DIM, optimizer=dej.optimizers.adam(0.1))
        restored = _restore(mngr, 1, live, {"w": np.zeros((2,), np.float32)})
    _assert_same(_snapshot(restored.tables["emb"]), at_save)
    assert not np.array_equal(_snapshot(table)[1], at_save[1])  # the live table moved on
    for x in (table, live):
        dej.destroy(x)


def test_a_failed_async_table_write_fails_the_step(tmp_path, monkeypatch):
    table = dej.create(DIM, optimizer=dej.optimizers.adagrad(0.1))
    table = _train(table, jax.jit(dej.apply_gradients), 1)
    _, release = _held_writer(monkeypatch, fail=OSError("disk full (injected)"))
    release.set()
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path / "fail", options=options) as mngr:
        _save(mngr, 1, table, {"w": np.ones((2,), np.float32)})
        with pytest.raises(Exception, match="disk full"):
            mngr.wait_until_finished()
        assert not (tmp_path / "fail" / "1").exists()
    dej.destroy(table)
