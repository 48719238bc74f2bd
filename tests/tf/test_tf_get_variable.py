"""``de.get_variable``'s store, as TFRA's (TF's variable-scope store of the default graph): names
under ``tf.compat.v1.variable_scope``, one store per default graph (reset by
``tf.compat.v1.reset_default_graph()``, as ``tf.test.TestCase`` does before each test), variables
kept alive by the store, shared with the ``tf.function``s traced from that graph, and
``reuse=False`` honoured in a TF1 graph. Reference: a dict of the rows written."""

import gc

import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de


@pytest.fixture(autouse=True)
def _fresh_default_graph():
    tf.compat.v1.reset_default_graph()
    yield
    tf.compat.v1.reset_default_graph()


def _rows(var, keys):
    return var.lookup(tf.constant(keys, tf.int64)).numpy()


def test_reset_default_graph_starts_a_new_store():
    a = de.get_variable("gv_reset", dim=2, initializer=0.0)
    a.upsert(tf.constant([1], tf.int64), tf.constant([[5.0, 6.0]]))
    assert de.get_variable("gv_reset", dim=2, initializer=0.0) is a
    tf.compat.v1.reset_default_graph()
    b = de.get_variable("gv_reset", dim=2, initializer=0.0)
    assert b is not a
    assert int(b.size()) == 0  # a fresh table, not a's rows
    np.testing.assert_array_equal(_rows(a, [1]), [[5.0, 6.0]])  # a itself is untouched


def test_store_keeps_the_variable_and_its_rows():
    """A model function that calls get_variable each time and keeps nothing must find its rows
    again (a fresh empty table would silently replace them)."""
    def model_step(ids):
        var = de.get_variable("gv_kept", dim=3, initializer=-1.0)
        return var.lookup(tf.constant(ids, tf.int64))

    de.get_variable("gv_kept", dim=3, initializer=-1.0).upsert(
        tf.constant([7, 8], tf.int64), tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    gc.collect()
    want = {7: [1.0, 2.0, 3.0], 8: [4.0, 5.0, 6.0], 9: [-1.0] * 3}
    np.testing.assert_array_equal(model_step([7, 8, 9]).numpy(), [want[k] for k in (7, 8, 9)])


def test_names_follow_the_variable_scope():
    with tf.compat.v1.variable_scope("tower"):
        scoped = de.get_variable("emb", dim=2)
        assert de.get_variable("emb", dim=2) is scoped
    plain = de.get_variable("emb", dim=2)
    assert scoped.name == "tower/emb"
    assert plain.name == "emb"
    assert plain is not scoped
    with tf.compat.v1.variable_scope("tower"):
        short = de.get_variable("emb", dim=2, short_file_name=True)
    assert short is plain  # short_file_name: no scope prefix, as in TFRA


def test_tf_function_shares_the_eager_store():
    outer = de.get_variable("gv_fn", dim=1, initializer=0.0)
    outer.upsert(tf.constant([3], tf.int64), tf.constant([[2.5]]))

    @tf.function
    def read(ids):
        return de.get_variable("gv_fn", dim=1, initializer=0.0).lookup(ids)

    np.testing.assert_array_equal(read(tf.constant([3, 4], tf.int64)).numpy(), [[2.5], [0.0]])


def test_reuse_false_in_a_tf1_graph_raises_and_the_graph_runs():
    with tf.Graph().as_default() as g:
        with tf.compat.v1.variable_scope("embedding", reuse=False):
            var = de.get_variable("t900", dim=2, initializer=-1.0)
            with pytest.raises(ValueError, match="Variable embedding/t900 already exists"):
                de.get_variable("t900", dim=2, initializer=-1.0)
        assert var.tables[0].table_id is None  # the session makes the table
        keys = tf.constant([1, 2], tf.int64)
        upsert = var.upsert(keys, tf.constant([[1.0, 2.0], [3.0, 4.0]]))
        found = var.lookup(tf.constant([2, 5], tf.int64))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(upsert)
            np.testing.assert_array_equal(sess.run(found), [[3.0, 4.0], [-1.0, -1.0]])
