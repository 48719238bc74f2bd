"""manifest.json is covered by a checksum (issue 9 item 4), and checkpoints written before specs
became JSON (manifest format version 1) keep loading, rows, slots and specs intact."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from table_rows import assert_same, snapshot  # tests/ helper
import _paths

safetensors_numpy = pytest.importorskip("safetensors.numpy")

FIXTURES = str(_paths.FIXTURES / "legacy_v1")


# ---- the manifest checksum --------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    """A checkpoint whose manifest holds a multi-digit step, beta_1 and initializer seed, and a
    live table with other contents (and another optimizer) to load it into."""
    rng = np.random.default_rng(0)
    t = Table(dim=4, initializer={"initializer": "normal", "mean": 0.0, "stddev": 0.5,
                                  "seed": 987654321},
              optimizer={"name": "adam", "flavor": "keras", "beta_1": 0.8125})
    keys = np.arange(50, dtype=np.int64)
    t.apply_gradients(keys, rng.normal(size=(50, 4)).astype(np.float32), 0.01, 1)
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, {"t": t}, steps={"t": 43210})
    live = Table(dim=4, optimizer={"name": "sgd", "flavor": "keras"})
    live.insert_or_assign(np.arange(7, dtype=np.int64) + 100, np.ones((7, 4), np.float32))
    return path, live


def meaningful_offsets(text: str) -> dict:
    """Byte offsets of the digits of "step", "beta_1" and the initializer "seed"."""
    out = {}
    for field in ("step", "beta_1", "seed"):
        m = re.search(rf'"{field}": (-?[0-9.e+-]+)', text)
        assert m, field
        out[field] = list(range(m.start(1), m.end(1)))
    return out


def test_every_bit_flip_of_meaningful_manifest_bytes_is_refused(saved, tmp_path):
    path, live = saved
    mpath = os.path.join(path, "manifest.json")
    original = open(mpath, "rb").read()
    offsets = meaningful_offsets(original.decode())
    assert sum(len(v) for v in offsets.values()) >= 15
    before_rows, before_opt = snapshot(live), live.optimizer
    refused = 0
    for field, where in offsets.items():
        for off in where:
            for bit in range(8):
                edited = bytearray(original)
                edited[off] ^= 1 << bit
                with open(mpath, "wb") as f:
                    f.write(edited)
                with pytest.raises(CheckpointError) as e:
                    checkpoint.load(path, {"t": live})
                assert "manifest" in str(e.value), (field, off, bit, e.value)
                with pytest.raises(CheckpointError):
                    checkpoint.load(path)  # nothing to compare with: the checksum alone
                refused += 1
    assert refused == 8 * sum(len(v) for v in offsets.values())
    assert_same(snapshot(live), before_rows)
    assert live.optimizer == before_opt
    # the unedited manifest still loads, with the saved step
    with open(mpath, "wb") as f:
        f.write(original)
    assert checkpoint.load(path, {"t": live}).steps["t"] == 43210


def test_the_checksum_file_is_required_and_checked(saved):
    path, live = saved
    cpath = os.path.join(path, "manifest.crc32.json")
    record = json.loads(open(cpath).read())
    assert record["file"] == "manifest.json"
    assert record["bytes"] == os.path.getsize(os.path.join(path, "manifest.json"))
    before = snapshot(live)
    with open(cpath, "w") as f:  # a corrupt checksum record is refused too
        f.write(json.dumps(dict(record, crc32=record["crc32"] ^ 1)))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        checkpoint.load(path, {"t": live})
    os.unlink(cpath)
    with pytest.raises(CheckpointError, match="manifest.crc32.json is missing"):
        checkpoint.load(path, {"t": live})
    assert_same(snapshot(live), before)


# ---- version-1 checkpoints ----------------------------------------------------------------------

def shard_arrays(path, entry):
    """The rows of one saved table read with safetensors alone (the independent reference)."""
    parts = [safetensors_numpy.load_file(os.path.join(path, s["file"])) for s in entry["shards"]]
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(out["keys"], kind="stable")
    return {k: v[order] for k, v in out.items()}


EXPECTED_V1 = {  # what the old writer meant, with the types today's specs have
    "adam": ({"initializer": "normal", "seed": 11, "mean": 0.0, "stddev": 0.5},
             {"name": "adam", "flavor": "keras", "beta_1": 0.5, "beta_2": 0.999,
              "epsilon": 1e-07, "amsgrad": False}),
    "vector": ({"initializer": "vector", "values": [0.5, 0.5, 0.5]},
               {"name": "adam", "flavor": "optax", "b1": 0.8, "b2": 0.999, "eps": 1e-08,
                "eps_root": 0.0, "nesterov": False, "amsgrad": False}),
    "ints": ({"initializer": "vector", "values": [1.0, 2.0]},
             {"name": "adagrad", "flavor": "keras", "initial_accumulator_value": 0.1,
              "epsilon": 1e-07, "epsilon_in_sqrt": True}),  # a later option, its default
    "dim1": ({"initializer": "vector", "values": [0.25]},
             {"name": "sgd", "flavor": "optax", "momentum": 0.0, "nesterov": False}),
}


def typed(d):
    return {k: (type(v).__name__, v) for k, v in d.items()}


def test_version_1_checkpoint_loads_with_rows_slots_and_specs(tmp_path):
    path = str(tmp_path / "v1")
    shutil.copytree(os.path.join(FIXTURES, "common"), path)
    raw = json.load(open(os.path.join(path, "manifest.json")))
    assert raw["version"] == 1 and not os.path.exists(os.path.join(path, "manifest.crc32.json"))
    assert raw["tables"][3]["initializer"]["values"] == 0.25  # the old reader's bare number

    ck = checkpoint.load(path)
    entries = {t["name"]: t for t in raw["tables"]}
    assert set(ck.tables) == set(EXPECTED_V1)
    for name, (init, opt) in EXPECTED_V1.items():
        t = ck.tables[name]
        ref = shard_arrays(path, entries[name])
        got = snapshot(t)
        np.testing.assert_array_equal(got["keys"], ref["keys"])
        np.testing.assert_array_equal(got["values"], ref["values"])
        names = entries[name]["slot_names"]
        if names:
            slots = np.stack([ref["slot." + s] for s in names], axis=1)
            assert np.abs(slots).sum() > 0  # trained: the slots carry state
            np.testing.assert_array_equal(got["slots"].reshape(slots.shape), slots)
        assert t.slot_names == entries[name]["slot_names"]
        assert typed(t.optimizer) == typed(opt)
        assert typed(t.initializer) == typed(init)
        assert ck.steps[name] == entries[name]["step"]
    # the initializer is live again: a new key of the dim-1 table starts at 0.25
    rows, _ = ck.tables["dim1"].find(np.array([10**6]))
    np.testing.assert_array_equal(rows, [[0.25]])

    # ... and saving it again writes version 2, which reads back the same
    again = str(tmp_path / "v2")
    checkpoint.save(again, ck.tables, steps=ck.steps)
    assert checkpoint.read_manifest(again)["version"] == 2
    ck2 = checkpoint.load(again)
    for name in EXPECTED_V1:
        assert_same(snapshot(ck2.tables[name]), snapshot(ck.tables[name]))
        assert typed(ck2.tables[name].optimizer) == typed(EXPECTED_V1[name][1])


def test_version_1_into_live_tables_keeps_the_saved_optimizer(tmp_path):
    """Loading into a live table with the same optimizer written as ints (0 for 0.0) keeps it
    attached and restores the saved slots."""
    path = str(tmp_path / "v1")
    shutil.copytree(os.path.join(FIXTURES, "common"), path)
    live = Table(dim=3, optimizer={"name": "adam", "flavor": "optax", "b1": 0.8, "eps_root": 0})
    live.insert_or_assign(np.array([99]), np.ones((1, 3), np.float32))
    ck = checkpoint.load(path, {"vector": live})
    entry = next(t for t in ck.manifest["tables"] if t["name"] == "vector")
    ref = shard_arrays(path, entry)
    got = snapshot(live)
    np.testing.assert_array_equal(got["keys"], ref["keys"])
    np.testing.assert_array_equal(got["values"], ref["values"])
    np.testing.assert_array_equal(got["slots"].reshape(-1, 2, 3),
                                  np.stack([ref["slot.mu"], ref["slot.nu"]], axis=1))
