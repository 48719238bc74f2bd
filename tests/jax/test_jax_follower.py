"""Live serving updates from JAX: ``dej.Publisher`` saves a training table into a directory
(deltas between full checkpoints) and ``dej.follow`` keeps a serving table at the newest one,
while jitted lookups run in another thread. References: the trainer's jitted lookups of the same
ids, and rows whose elements all equal one version (a half-written row would mix two)."""
import threading

import jax
import numpy as np

import dualemb.jax as dej

DIM = 8


def test_serving_table_follows_the_trainer(tmp_path):
    trainer = dej.create(DIM, initializer=dej.initializers.normal(0, 0.1, seed=1),
                         optimizer=dej.optimizers.adam(0.01))
    serving = dej.create(DIM, initializer=dej.initializers.normal(0, 0.1, seed=1))
    pub = dej.Publisher(tmp_path, full_every=2)
    follower = dej.follow(tmp_path, {"table": serving})
    step = jax.jit(dej.apply_gradients)
    lookup = jax.jit(dej.lookup)
    rng = np.random.default_rng(0)
    ids = dej.ids(np.arange(120))
    for k in range(1, 6):
        batch = rng.integers(0, 100, 40)
        trainer = step(trainer, dej.ids(batch), rng.standard_normal((40, DIM)).astype(np.float32))
        pub.publish(trainer)
        applied = follower.poll()
        assert [a.steps["table"] for a in applied] == [k]
        assert applied[0].delta == (k % 2 == 0)
        # Keys 100..119 were never trained: both answer the same initializer rows for them.
        np.testing.assert_array_equal(np.asarray(lookup(serving, ids)),
                                      np.asarray(lookup(trainer, ids)))
    dej.destroy(trainer)
    dej.destroy(serving)


def test_jitted_lookups_during_updates_never_see_a_mixed_row(tmp_path):
    keys = np.arange(300)
    trainer = dej.create(DIM)
    serving = dej.create(DIM)
    pub = dej.Publisher(tmp_path, full_every=3)
    follower = dej.follow(tmp_path, serving)
    lookup = jax.jit(dej.lookup)
    ids = dej.ids(keys)
    stop, problems = threading.Event(), []

    def reader():
        while not stop.is_set() and len(problems) < 5:
            rows = np.asarray(lookup(serving, ids))
            if (rows.min(axis=1) != rows.max(axis=1)).any():
                problems.append(rows[rows.min(axis=1) != rows.max(axis=1)][0])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        rng = np.random.default_rng(1)
        for version in range(1, 10):
            pick = dej.ids(rng.choice(keys, 150, replace=False))
            trainer = dej.insert(trainer, pick, np.full((150, DIM), version, np.float32))
            pub.publish(trainer, step=version)  # inserts do not count steps
            follower.poll()
            np.testing.assert_array_equal(np.asarray(lookup(serving, ids)),
                                          np.asarray(lookup(trainer, ids)))
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and problems == []
    dej.destroy(trainer)
    dej.destroy(serving)


def test_the_online_serving_example_runs(capsys):
    """examples/online_serving.py, both sides in one process, bounded: the server ends at the
    trainer's last published step."""
    import importlib.util

    from _paths import ROOT
    spec = importlib.util.spec_from_file_location(
        "online_serving_example", ROOT / "examples" / "online_serving.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--steps", "40", "--every", "10", "--full-every", "2",
                         "--seconds", "60"]) == 0
    out = capsys.readouterr().out
    assert "published step-000000000040" in out
    # Full checkpoints at 10 and 30, deltas at 20 and 40: the server ends on the last delta.
    assert "server: now at step 40 (delta)" in out
