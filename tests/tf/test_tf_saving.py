"""Saving a de.Variable through TF object checkpoints (tf.train.Checkpoint, CheckpointManager),
the common checkpoint format (de.save / de.load, save_to_file_system / load_from_file_system),
and what must be refused. Every round trip checks exact table contents (keys -> rows, slots,
per-key metadata) after the live tables were changed in between, so a restore that merged
instead of replacing would fail."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from dualemb.core import Table
from dualemb.core import checkpoint as core_ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.tf import ops as de_ops
from dualemb.tf import saving
from dualemb.tf.saving import variable_state
from dualemb.tf.variable import Variable

import _paths

ADAM = ('{"name": "adam", "flavor": "keras", "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07, '
        '"amsgrad": false}')


def contents(var):
    """key -> (row, slots, last_update, update_count) over every shard, plus which shard holds
    each key (shard index by the variable's partitioner must match where it is stored)."""
    out = {}
    for i, t in enumerate(var.tables):
        e = Table.attach(t.table_id).export()
        for j, k in enumerate(e["keys"].tolist()):
            out[k] = (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["last_update"][j]),
                      int(e["update_count"][j]), i)
    return out


def rows_only(c):
    return {k: v[:2] for k, v in c.items()}


def route(var, keys):
    return var.partition_fn(tf.constant(keys, var.key_dtype), var.shard_num).numpy()


def trained_variable(name="emb", shards=2, dim=4, n=40, key_dtype=tf.int64, seed=0):
    """A Variable with an Adam optimizer attached and two fused steps applied, so rows, slots,
    last_update and update_count all differ between keys."""
    var = Variable(key_dtype=key_dtype, dim=dim, devices=["/CPU:0"] * shards, name=name,
                   initializer=tf.keras.initializers.RandomNormal(seed=seed))
    for t in var.tables:
        t.set_optimizer(ADAM)
    rng = np.random.default_rng(seed)
    keys = rng.choice(10_000, size=n, replace=False).astype(key_dtype.as_numpy_dtype) - 5000
    for step in (1, 2):
        sub = keys[: n - 10 * (step - 1)]
        sid = route(var, sub)
        for i, t in enumerate(var.tables):
            k = sub[sid == i]
            Table.attach(t.table_id).apply_gradients(
                k, rng.normal(size=(len(k), dim)).astype(np.float32), 0.01, step)
    return var, keys


def scramble(var):
    """Changes every shard: clears it, inserts a foreign key and rewrites."""
    var.clear()
    var.upsert(tf.constant([123456789], var.key_dtype), tf.fill([1, var.dim], 7.0))


# ---- tf.train.Checkpoint ------------------------------------------------------------------------

def test_checkpoint_round_trip_replaces_contents(tmp_path):
    var, keys = trained_variable()
    before = contents(var)
    assert len(before) == len(keys) and all(any(s) for _, s, *_ in before.values())
    ckpt = tf.train.Checkpoint(emb=var)
    path = ckpt.save(str(tmp_path / "ckpt"))
    scramble(var)
    assert contents(var) != before
    ckpt.restore(path).assert_consumed()
    assert contents(var) == before  # rows, slots, metadata, and the shard of every key
    # Lookups see the restored rows.
    got = var.lookup(tf.constant(keys, tf.int64)).numpy()
    np.testing.assert_array_equal(got, np.array([before[k][0] for k in keys.tolist()], np.float32))


def test_checkpoint_tensor_layout(tmp_path):
    var, keys = trained_variable(shards=3)
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    shapes = dict(tf.train.list_variables(path))
    (prefix,) = [k[: -len("keys")] for k in shapes if k.endswith(".ATTRIBUTES/keys")]
    assert prefix.startswith("emb/")
    assert shapes[prefix + "keys"] == [len(keys)]
    assert shapes[prefix + "values"] == [len(keys), 4]
    assert shapes[prefix + "slots"] == [len(keys), 2, 4]  # adam: momentum, velocity
    assert shapes[prefix + "last_update"] == [len(keys)]
    assert shapes[prefix + "update_count"] == [len(keys)]
    reader = tf.train.load_checkpoint(path)
    meta = variable_state.parse_meta(reader.get_tensor(prefix + "meta"), "test")
    assert meta["dim"] == 4 and meta["key_dtype"] == "int64" and meta["num_shards"] == 3
    assert meta["describe"]["optimizer"] == json.loads(ADAM)
    np.testing.assert_array_equal(np.sort(reader.get_tensor(prefix + "keys")), np.sort(keys))


@pytest.mark.parametrize("shards_after", [1, 3])
def test_checkpoint_reshards(tmp_path, shards_after):
    var, keys = trained_variable(shards=2)
    before = contents(var)
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    other = Variable(dim=4, devices=["/CPU:0"] * shards_after, name="emb2")
    other.upsert(tf.constant([5, 6], tf.int64), tf.ones([2, 4]))
    tf.train.Checkpoint(emb=other).restore(path).assert_consumed()
    after = contents(other)
    assert {k: v[:4] for k, v in after.items()} == {k: v[:4] for k, v in before.items()}
    # Every key sits in the shard the partitioner routes it to.
    sid = route(other, np.array(sorted(after), np.int64))
    assert [after[k][4] for k in sorted(after)] == sid.tolist()
    assert other.size().numpy() == len(keys)


@pytest.mark.parametrize("shards_after", [1, 3])
def test_de_checkpoint_saves_and_reshards_like_tf_checkpoint(tmp_path, shards_after):
    """TFRA's de.train.DECheckpoint: a tf.train.Checkpoint (same files, either reads the other's)
    that carries the tables, restored into another shard count."""
    from dualemb.tf.train import DECheckpoint
    var, keys = trained_variable(shards=2)
    before = contents(var)
    module = tf.Module()
    module.emb = var
    ckpt = DECheckpoint(module)
    assert isinstance(ckpt, tf.train.Checkpoint)
    path = ckpt.save(str(tmp_path / "ckpt"))
    other = tf.Module()
    other.emb = Variable(dim=4, devices=["/CPU:0"] * shards_after, name="emb2")
    other.emb.upsert(tf.constant([5, 6], tf.int64), tf.ones([2, 4]))  # replaced, not merged
    DECheckpoint(other).restore(path).assert_consumed()
    after = contents(other.emb)
    assert {k: v[:4] for k, v in after.items()} == {k: v[:4] for k, v in before.items()}
    third = tf.Module()
    third.emb = Variable(dim=4, devices=["/CPU:0"], name="emb3")
    tf.train.Checkpoint(third).restore(path).assert_consumed()  # plain TF reads it too
    assert {k: v[:2] for k, v in contents(third.emb).items()} == rows_only(before)


def test_restore_attaches_the_saved_optimizer(tmp_path):
    var, _ = trained_variable()
    before = contents(var)
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    fresh = Variable(dim=4, devices=["/CPU:0"] * 2, name="fresh")  # no optimizer yet
    tf.train.Checkpoint(emb=fresh).restore(path)
    assert contents(fresh) == before
    for t in fresh.tables:
        assert Table.attach(t.table_id).slot_names == ["momentum", "velocity"]
        # a SavedModel would re-create it with Adam
        assert json.loads(t.optimizer_spec) == json.loads(ADAM)
    # Attaching the same optimizer again (what DynamicEmbeddingOptimizer does) keeps the slots.
    for t in fresh.tables:
        t.set_optimizer(ADAM)
    assert contents(fresh) == before


def test_checkpoint_manager_keeps_and_restores_versions(tmp_path):
    var, keys = trained_variable(shards=2)
    ckpt = tf.train.Checkpoint(emb=var)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path / "mgr"), max_to_keep=2)
    snapshots = []
    for i in range(3):
        var.upsert(tf.constant([10_000 + i], tf.int64), tf.fill([1, 4], float(i)))
        manager.save()
        snapshots.append(contents(var))
    assert len(manager.checkpoints) == 2
    scramble(var)
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
    assert contents(var) == snapshots[2]
    ckpt.restore(manager.checkpoints[0]).assert_consumed()
    assert contents(var) == snapshots[1]
    assert 10_002 not in contents(var)  # replaced, not merged


def test_deferred_restore_when_variable_is_attached_later(tmp_path):
    var, _ = trained_variable()
    before = contents(var)
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    root = tf.train.Checkpoint()
    status = root.restore(path)
    late = Variable(dim=4, devices=["/CPU:0"] * 2, name="late")
    late.upsert(tf.constant([1], tf.int64), tf.ones([1, 4]))
    root.emb = late  # TF restores it now
    status.assert_consumed()
    assert contents(late) == before


def test_restore_inside_tf_function_graph(tmp_path):
    """The restore path also works in graph mode (what a SavedModel stores)."""
    var, _ = trained_variable()
    before = contents(var)
    tensors = {k: tf.identity(v) for k, v in variable_state.export_tensors(var).items()}
    scramble(var)

    @tf.function
    def restore(t):
        saving.restore_variable(var, t)

    restore(tensors)
    assert contents(var) == before


@pytest.mark.parametrize("policy", ["TimestampRestrictPolicy", "FrequencyRestrictPolicy"])
def test_restored_metadata_drives_restrict_policies(tmp_path, policy):
    """The policy's status (its own table's last_update / update_count) comes back, so
    restrict() after a restore keeps the same keys as restrict() on the original. The status
    only changes through apply_update (as in TFRA), so the test feeds it, not upserts alone."""
    import dualemb.tf as de

    def make(name, shards):
        return Variable(dim=2, devices=["/CPU:0"] * shards, name=name,
                        restrict_policy=getattr(de, policy))

    var = make("restricted", 2)
    for i in range(12):  # key k is written k + 1 times, and higher keys are written last
        keys = np.arange(i, 12, dtype=np.int64)
        var.upsert(tf.constant(keys[::-1].copy()), tf.fill([len(keys), 2], float(i)))
        var.restrict_policy.apply_update(tf.constant(keys[::-1].copy()))
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    other = make("restricted2", 2)  # restrict() keeps num_reserved / N keys per shard
    tf.train.Checkpoint(emb=other).restore(path)
    var.restrict(4, trigger=4)
    other.restrict(4, trigger=4)
    kept = sorted(var.export()[0].numpy().tolist())
    assert sorted(other.export()[0].numpy().tolist()) == kept and len(kept) == 4
    # Both policies rank the highest keys best (written last and most often): 2 per shard.
    parts = de.default_partition_fn(tf.range(12, dtype=tf.int64), 2).numpy()
    expected = sorted(sorted(np.flatnonzero(parts == i).tolist())[-2:] for i in range(2))
    assert kept == sorted(sum(expected, []))


def test_empty_variable_round_trip(tmp_path):
    var = Variable(dim=3, devices=["/CPU:0"] * 2, name="empty")
    ckpt = tf.train.Checkpoint(emb=var)
    path = ckpt.save(str(tmp_path / "ckpt"))
    var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
    ckpt.restore(path)
    assert var.size().numpy() == 0


def test_checkpoint_false_variable_is_not_saved(tmp_path):
    var = Variable(dim=3, name="nosave", checkpoint=False)
    var.upsert(tf.constant([1], tf.int64), tf.ones([1, 3]))
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    assert not any("emb/" in n for n, _ in tf.train.list_variables(path))
    var.upsert(tf.constant([2], tf.int64), tf.ones([1, 3]))
    tf.train.Checkpoint(emb=var).restore(path)
    assert var.size().numpy() == 2


# ---- refused restores leave the variable unchanged ------------------------------------------------

@pytest.mark.parametrize("kwargs, what", [
    ({"dim": 5}, "dim mismatch"),
    ({"dim": 4, "key_dtype": tf.int32}, "key dtype mismatch"),
    # Values are saved in the variable's value dtype, so TF's own restore refuses the saved
    # float32 tensor before dualemb sees it (its message names both dtypes).
    ({"dim": 4, "value_dtype": tf.float16}, "expected dtype half does not equal original dtype float"),
])
def test_restore_into_other_dim_or_dtype_is_refused(tmp_path, kwargs, what):
    var, _ = trained_variable()
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    other = Variable(devices=["/CPU:0"] * 2, name="other", **kwargs)
    kd = other.key_dtype
    other.upsert(tf.constant([1, 2, 3], kd),
                 tf.cast(tf.reshape(tf.range(3 * other.dim, dtype=tf.float32), [3, other.dim]),
                         other.value_dtype))
    unchanged = contents(other)
    with pytest.raises((CheckpointError, tf.errors.InvalidArgumentError), match=what):
        tf.train.Checkpoint(emb=other).restore(path)
    assert contents(other) == unchanged


def test_restore_refused_in_graph_mode_leaves_table_unchanged():
    var, _ = trained_variable()
    tensors = variable_state.export_tensors(var)
    other = Variable(dim=5, name="other5")
    other.upsert(tf.constant([1], tf.int64), tf.ones([1, 5]))
    unchanged = contents(other)

    @tf.function
    def restore(t):
        saving.restore_variable(other, t)

    with pytest.raises(tf.errors.InvalidArgumentError, match="dim mismatch"):
        restore(tensors)
    assert contents(other) == unchanged


def test_restore_of_corrupt_description_is_refused():
    var, _ = trained_variable()
    tensors = dict(variable_state.export_tensors(var))
    other = Variable(dim=4, name="o")
    other.upsert(tf.constant([1], tf.int64), tf.ones([1, 4]))
    unchanged = contents(other)
    bad = dict(tensors, meta=tf.constant("{not json"))
    with pytest.raises(CheckpointError, match="not valid JSON"):
        saving.restore_variable(other, bad)
    bad = dict(tensors)
    del bad["slots"]
    with pytest.raises(CheckpointError, match="lacks tensors"):
        saving.restore_variable(other, bad)
    bad = dict(tensors, values=tensors["values"][:-1])
    with pytest.raises(CheckpointError, match="shape"):
        saving.restore_variable(other, bad)
    assert contents(other) == unchanged


# ---- the common checkpoint format ---------------------------------------------------------------

def test_de_save_load_variable_round_trip(tmp_path):
    var, _ = trained_variable(shards=2)
    before = contents(var)
    saving.save(var, tmp_path / "common", step=17)
    manifest = core_ckpt.read_manifest(tmp_path / "common")
    (entry,) = manifest["tables"]
    assert entry["name"] == "emb" and entry["dim"] == 4 and entry["step"] == 17
    assert entry["slot_names"] == ["momentum", "velocity"] and entry["rows"] == len(before)
    scramble(var)
    saving.load(var, tmp_path / "common")
    assert contents(var) == before


def test_de_save_is_readable_without_tensorflow_objects(tmp_path):
    """What de.save wrote loads into plain core tables (as the JAX front end does)."""
    var, _ = trained_variable(shards=2)
    before = contents(var)
    saving.save(var, tmp_path / "common")
    ck = core_ckpt.load(tmp_path / "common")
    t = ck.tables["emb"]
    e = t.export()
    got = {k: (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["update_count"][j]))
           for j, k in enumerate(e["keys"].tolist())}
    assert got == {k: (v[0], v[1], v[3]) for k, v in before.items()}
    t.destroy()


@pytest.mark.parametrize("shards_after", [1, 3])
def test_de_load_reshards(tmp_path, shards_after):
    var, _ = trained_variable(shards=2)
    before = contents(var)
    saving.save(var, tmp_path / "common")
    other = Variable(dim=4, devices=["/CPU:0"] * shards_after, name="emb")
    other.upsert(tf.constant([3], tf.int64), tf.ones([1, 4]))
    saving.load(other, tmp_path / "common")
    after = contents(other)
    assert {k: v[:4] for k, v in after.items()} == {k: v[:4] for k, v in before.items()}
    sid = route(other, np.array(sorted(after), np.int64))
    assert [after[k][4] for k in sorted(after)] == sid.tolist()


def test_de_load_into_other_dim_is_refused(tmp_path):
    var, _ = trained_variable()
    saving.save(var, tmp_path / "common")
    other = Variable(dim=5, name="emb")
    other.upsert(tf.constant([1], tf.int64), tf.ones([1, 5]))
    unchanged = contents(other)
    with pytest.raises(CheckpointError, match="dim mismatch"):
        saving.load(other, tmp_path / "common")
    assert contents(other) == unchanged
    other32 = Variable(dim=4, key_dtype=tf.int32, name="emb")
    with pytest.raises(CheckpointError, match="key dtype mismatch"):
        saving.load(other32, tmp_path / "common")


def test_de_load_missing_variable_is_refused(tmp_path):
    var, _ = trained_variable()
    saving.save(var, tmp_path / "common")
    a = Variable(dim=4, name="a")
    b = Variable(dim=4, name="b")
    with pytest.raises(CheckpointError, match="not in the checkpoint"):
        saving.load({"x": a, "y": b}, tmp_path / "common")


def test_de_load_matches_tables_by_position_when_names_differ(tmp_path):
    a, _ = trained_variable(name="a", dim=4, seed=1)
    b, _ = trained_variable(name="b", dim=3, seed=2)
    saving.save([a, b], tmp_path / "common")
    a2 = Variable(dim=4, devices=["/CPU:0"] * 2, name="a_other")
    b2 = Variable(dim=3, devices=["/CPU:0"] * 2, name="b_other")
    saving.load([a2, b2], tmp_path / "common")
    assert rows_only(contents(a2)) == rows_only(contents(a))
    assert rows_only(contents(b2)) == rows_only(contents(b))
    # Dims that disagree in order: no positional match, the names are reported missing.
    with pytest.raises(CheckpointError, match="not in the checkpoint"):
        saving.load([b2, a2], tmp_path / "common")


def test_save_to_file_system_round_trip(tmp_path):
    var, _ = trained_variable(shards=2)
    before = contents(var)
    path = var.save_to_file_system(str(tmp_path / "kv"))
    assert os.path.isfile(os.path.join(path, "manifest.json"))
    scramble(var)
    var.load_from_file_system(str(tmp_path / "kv"))
    assert contents(var) == before
    # Into another shard count, and with the TFRA env var naming the directory.
    other = Variable(dim=4, devices=["/CPU:0"] * 3, name="emb")
    os.environ["DUALEMB_TEST_KV"] = str(tmp_path / "kv")
    try:
        other.load_from_file_system("/nonexistent", dirpath_env="DUALEMB_TEST_KV")
    finally:
        del os.environ["DUALEMB_TEST_KV"]
    assert {k: v[:4] for k, v in contents(other).items()} == {k: v[:4] for k, v in before.items()}


def test_table_level_file_system_save_and_load_route_keys(tmp_path):
    """TFRA's var.tables[i].save_to_file_system / load_from_file_system (file:// URLs, file_name,
    load_entire_dir): the loaded keys land in the shard the partitioner routes them to, so
    lookups through the Variable find every one (reference: the source's rows)."""
    var, keys = trained_variable(name="src", shards=2)
    before = contents(var)
    url = "file://" + str(tmp_path / "fs")
    for t in var.tables:
        t.save_to_file_system(url)
    dest = Variable(dim=4, devices=["/CPU:0"] * 2, name="dst")
    dest.upsert(tf.constant([999_999], tf.int64), tf.ones([1, 4]))  # kept: a load merges
    dest.tables[0].load_from_file_system(url, file_name="src", load_entire_dir=True)
    after = contents(dest)
    assert {k: v[:4] for k, v in after.items() if k != 999_999} == {
        k: v[:4] for k, v in before.items()}
    assert 999_999 in after
    sid = route(dest, np.array(sorted(after), np.int64))
    assert [after[k][4] for k in sorted(after)] == sid.tolist()
    np.testing.assert_array_equal(dest.lookup(tf.constant(keys, tf.int64)).numpy(),
                                  [before[k][0] for k in keys.tolist()])
    # One table under a file name of its own, loaded through the other shard of a new Variable.
    var.tables[0].save_to_file_system(str(tmp_path / "one"), file_name="test")
    one = Variable(dim=4, devices=["/CPU:0"] * 2, name="one")
    one.tables[1].load_from_file_system(str(tmp_path / "one"), file_name="test")
    shard0 = {k: v[0] for k, v in before.items() if v[4] == 0}
    assert {k: v[0] for k, v in contents(one).items()} == shard0
    with pytest.raises(CheckpointError, match="no saved table"):
        one.tables[0].load_from_file_system(str(tmp_path / "one"), file_name="nothing")


def test_file_system_ranks_and_entire_dir(tmp_path):
    var, keys = trained_variable(shards=2)
    before = contents(var)
    sid = np.array([k % 2 for k in keys])
    # Two "ranks" each save half of the keys.
    halves = []
    for r in range(2):
        part = Variable(dim=4, name="emb")
        part.tables[0].set_optimizer(ADAM)
        Table.attach(part.tables[0].table_id).import_rows(
            *(lambda e: (e["keys"], e["values"], e["slots"], e["last_update"],
                         e["update_count"]))(
                _subset(var, keys[sid == r])))
        halves.append(part.save_to_file_system(str(tmp_path / "kv"), proc_size=2, proc_rank=r))
    assert sorted(os.listdir(tmp_path / "kv")) == ["emb_rank0_size2", "emb_rank1_size2"]
    whole = Variable(dim=4, devices=["/CPU:0"] * 2, name="emb")
    whole.upsert(tf.constant([424242], tf.int64), tf.ones([1, 4]))
    n = whole.load_from_file_system(str(tmp_path / "kv"), load_entire_dir=True)
    assert n == len(keys)
    assert {k: v[:2] + v[3:4] for k, v in contents(whole).items()} == \
        {k: v[:2] + v[3:4] for k, v in before.items()}
    one = Variable(dim=4, name="emb")
    one.load_from_file_system(str(tmp_path / "kv"), proc_size=2, proc_rank=1)
    assert sorted(contents(one)) == sorted(keys[sid == 1].tolist())


def _subset(var, keys):
    parts = [Table.attach(t.table_id).export() for t in var.tables]
    cat = {f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
    idx = {k: i for i, k in enumerate(cat["keys"].tolist())}
    sel = np.array([idx[k] for k in keys.tolist()], np.int64)
    return {f: v[sel] for f, v in cat.items()}


def test_load_from_file_system_refuses_other_dim(tmp_path):
    var, _ = trained_variable()
    var.save_to_file_system(str(tmp_path / "kv"))
    other = Variable(dim=3, name="emb")
    other.upsert(tf.constant([1], tf.int64), tf.ones([1, 3]))
    with pytest.raises(CheckpointError, match="dim mismatch"):
        other.load_from_file_system(str(tmp_path / "kv"))
    assert other.size().numpy() == 1


# ---- SavedModel of a bare Variable, served from a fresh process ------------------------------------

_SERVE_VARIABLE = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf  # registers the dualemb ops
from dualemb.core import Table
path, keys_file, out = sys.argv[1:4]
keys = np.load(keys_file)
loaded = tf.saved_model.load(path)
rows = loaded.lookup(tf.constant(keys)).numpy()
size = int(loaded.size().numpy())
slots = np.concatenate([Table.attach(int(i)).export()["slots"] for i in loaded.ids().numpy()])
np.savez(out, rows=rows, size=size, slots_shape=np.array(slots.shape))
"""


def test_saved_model_of_variable_in_fresh_process(tmp_path):
    cls = Variable
    import subprocess
    import sys

    var = cls(dim=4, devices=["/CPU:0"] * 2, name="served",
              initializer=tf.keras.initializers.RandomNormal(seed=5))
    for t in var.tables:
        t.set_optimizer(ADAM)
    keys = np.arange(-20, 20, dtype=np.int64)
    sid = route(var, keys)
    for i, t in enumerate(var.tables):
        Table.attach(t.table_id).apply_gradients(keys[sid == i], np.ones(((sid == i).sum(), 4),
                                                                         np.float32), 0.1, 1)
    module = tf.Module()
    module.var = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    module.size = tf.function(lambda: var.size(), input_signature=[])
    # The loaded model's own tables have fresh ids: read them from its handles.
    module.ids = tf.function(lambda: tf.stack([de_ops.table_id(t.resource) for t in var.tables]),
                             input_signature=[])
    path = tmp_path / "sm"
    tf.saved_model.save(module, str(path))
    query = np.concatenate([keys, [1000, 1001]])  # two keys that were never trained
    np.save(tmp_path / "keys.npy", query)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_paths.ROOT) + \
        os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _SERVE_VARIABLE, str(path),
                        str(tmp_path / "keys.npy"), str(tmp_path / "out.npz")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["rows"], var.lookup(tf.constant(query)).numpy())
    assert int(out["size"]) == len(keys)
    assert out["slots_shape"].tolist() == [len(keys), 2, 4]  # Adam's slots came along


_TF1_LOADER = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf
tf.compat.v1.disable_eager_execution()
path, keys_file, out = sys.argv[1:4]
with tf.compat.v1.Session() as sess:
    graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
    sig = graph.signature_def["serving_default"]
    feed = {list(sig.inputs.values())[0].name: np.load(keys_file)}
    np.save(out, sess.run(list(sig.outputs.values())[0].name, feed))
"""


def test_saved_model_tf1_loader_restores_rows(tmp_path):
    """The TF1 saver a SavedModel stores (what C++ loaders run) restores the rows too."""
    import subprocess
    import sys

    var, keys = trained_variable(name="tf1", shards=2)
    module = tf.Module()
    module.var = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.lookup})
    query = np.concatenate([keys, np.array([777_777], np.int64)])
    np.save(tmp_path / "keys.npy", query)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_paths.ROOT) + \
        os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _TF1_LOADER, str(tmp_path / "sm"),
                        str(tmp_path / "keys.npy"), str(tmp_path / "out.npy")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"),
                                  var.lookup(tf.constant(query)).numpy())
