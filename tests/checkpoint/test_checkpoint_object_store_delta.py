"""Deltas and live serving updates on an object store (moto's S3 server on 127.0.0.1): a delta
chain saved to s3:// URLs loads equal to the trainer's table (rows, slots, steps, erased keys
gone), a delta whose base was saved again is refused, and a ``checkpoint.Follower`` polling an
s3:// directory that a ``checkpoint.Publisher`` writes keeps serving tables equal to the
trainer's. References: the trainer's own rows (numpy on ``export``)."""

import json

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from table_rows import ROW_FIELDS, rows_by_key  # tests/ helper

import _object_store_servers as servers

fsspec = pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not installed")

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A bucket on a moto S3 server of this module (one server for every test here)."""
    with servers.s3_bucket(str(tmp_path_factory.mktemp("moto"))) as url:
        yield url


def state(tables):
    """{key: (value, slots, last_update, update_count, stepped)} over every shard."""
    return rows_by_key(tables, ROW_FIELDS + ("stepped",))


def train_step(t, rng, step):
    """Steps, new keys and erases: every kind of change a delta carries."""
    keys = rng.integers(0, 300, 40).astype(np.int64)
    t.apply_gradients(keys, rng.standard_normal((40, DIM)).astype(np.float32), 0.01, step)
    if step % 2 == 0:
        t.erase(rng.integers(0, 300, 15).astype(np.int64))


def manifest_of(url) -> dict:
    fs, p = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    gen = json.loads(fs.cat_file(f"{p}/commit.json"))["generation"]
    return json.loads(fs.cat_file(f"{p}/{gen}/manifest.json"))


def test_delta_chain_saves_and_loads_on_s3(s3):
    rng = np.random.default_rng(0)
    trainer = Table(DIM, optimizer=ADAM)
    train_step(trainer, rng, 1)
    full, d2, d3 = (f"{s3}/chain/step-{i}" for i in (1, 2, 3))
    checkpoint.save(full, {"emb": trainer}, steps=1)
    train_step(trainer, rng, 2)
    checkpoint.save(d2, {"emb": trainer}, steps=2, base=full)
    train_step(trainer, rng, 3)
    checkpoint.save(d3, {"emb": trainer}, steps=3, base=d2)

    # The base is named by its URL, relative to the delta's generation prefix.
    assert manifest_of(d3)["base"]["path"] == "../../step-2"
    assert manifest_of(d2)["base"]["path"] == "../../step-1"
    fresh = [Table(DIM), Table(DIM)]  # another shard count: rows routed on load
    ckpt = checkpoint.load(d3, {"emb": fresh})
    assert ckpt.steps == {"emb": 3}
    assert state(fresh) == state(trainer)

    # Saving the base again (a new generation) breaks the chain: refused, naming it.
    checkpoint.save(d2, {"emb": trainer}, steps=2)
    with pytest.raises(CheckpointError, match="the base was replaced"):
        checkpoint.load(d3)


def test_a_delta_and_its_base_must_share_the_store(s3, tmp_path):
    t = Table(DIM, optimizer=ADAM)
    train_step(t, np.random.default_rng(1), 1)
    checkpoint.save(tmp_path / "local", {"emb": t}, steps=1)
    with pytest.raises(CheckpointError, match="not on one file system"):
        checkpoint.save(f"{s3}/mixed/delta", {"emb": t}, steps=2, base=tmp_path / "local")


def test_follower_polls_an_s3_directory_a_publisher_writes(s3):
    rng = np.random.default_rng(2)
    trainer = Table(DIM, optimizer=ADAM)
    directory = f"{s3}/live"
    serving = [Table(DIM), Table(DIM)]
    follower = checkpoint.Follower(directory, {"emb": serving})  # nothing published yet
    assert follower.poll() == []
    pub = checkpoint.Publisher(directory, {"emb": trainer}, full_every=3)
    kinds = []
    for step in range(1, 6):
        train_step(trainer, rng, step)
        pub.publish(step)
        if step == 2:
            continue  # the next poll applies two deltas
        kinds.append([(a.steps["emb"], a.delta) for a in follower.poll()])
        assert state(serving) == state(trainer), step
        assert follower.poll() == []
    assert kinds == [[(1, False)], [(2, True), (3, True)], [(4, False)], [(5, True)]]
