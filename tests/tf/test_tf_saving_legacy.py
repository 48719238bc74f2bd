"""A TF object checkpoint written before specs became JSON (its metadata describes the table in
the old "config|optimizer" text) restores into today's de.Variable, rows, slots and optimizer
intact."""

import json

import numpy as np
import pytest
import tensorflow as tf

from dualemb.core import Table
from dualemb.tf.variable import Variable
import _paths

CKPT = str(_paths.FIXTURES / "legacy_v1" / "tf" / "ckpt")


def saved_tensors():
    """The checkpoint's own tensors, read with TF's reader (the independent reference)."""
    reader = tf.train.load_checkpoint(CKPT)
    names = reader.get_variable_to_shape_map()
    (prefix,) = [n[: -len("keys")] for n in names if n.endswith(".ATTRIBUTES/keys")]
    return {f: reader.get_tensor(prefix + f) for f in ("keys", "values", "slots", "meta")}


def contents(var):
    out = {}
    for t in var.tables:
        e = Table.attach(t.table_id).export()
        for j, k in enumerate(e["keys"].tolist()):
            out[k] = (e["values"][j].tolist(), e["slots"][j].tolist())
    return out


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_version_1_metadata_restores(shards):
    ref = saved_tensors()
    assert b'"describe": "dim=3;' in ref["meta"]  # really the old form
    var = Variable(dim=3, devices=["/CPU:0"] * shards, name=f"legacy_restore_{shards}")
    var.upsert(tf.constant([999], tf.int64), tf.ones([1, 3]))  # replaced by the restore
    tf.train.Checkpoint(emb=var).read(CKPT).assert_consumed()
    want = {int(k): (v.tolist(), s.tolist())
            for k, v, s in zip(ref["keys"], ref["values"], ref["slots"])}
    assert np.abs(ref["slots"]).sum() > 0
    assert contents(var) == want
    for t in var.tables:
        opt = Table.attach(t.table_id).optimizer
        assert opt == {"name": "adam", "flavor": "keras", "beta_1": 0.5, "beta_2": 0.999,
                       "epsilon": 1e-07, "amsgrad": False}
        assert all(isinstance(opt[k], float) for k in ("beta_1", "beta_2", "epsilon"))


@pytest.mark.parametrize("optimizer", [None, '{"name": "adam", "flavor": "keras", "epsilon": 0}'])
def test_graph_and_eager_read_the_same_optimizer(optimizer):
    """Inside a traced restore the optimizer is cut out of the meta JSON by a regex; it must give
    what the eager JSON reader gives."""
    from dualemb.tf.saving import variable_state as saving

    var = Variable(dim=3, devices=["/CPU:0"] * 2, name="graph_meta")
    if optimizer:
        for t in var.tables:
            t.set_optimizer(optimizer)
    meta = saving.export_tensors(var)["meta"]
    traced = tf.function(saving._optimizer_of, autograph=False)(meta).numpy().decode()
    eager = saving._optimizer_of(meta).numpy().decode()
    assert traced == eager
    if optimizer:
        assert json.loads(eager) == dict(json.loads(optimizer), beta_1=0.9, beta_2=0.999,
                                         amsgrad=False)
    else:
        assert eager == ""


def test_version_1_metadata_in_a_traced_restore_fails_loudly():
    from dualemb.tf.saving import variable_state as saving

    meta = tf.constant(saved_tensors()["meta"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="older dualemb"):
        tf.function(saving._optimizer_of, autograph=False)(meta)
