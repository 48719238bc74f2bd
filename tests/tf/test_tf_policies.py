"""Restrict policies' status (TFRA's restrict_policies semantics) and optimizer slot views,
against independent dict / numpy references."""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf import ops
from sum_loss_training import train_sum_loss

_counter = [0]


def _var(shards=1, **kw):
    _counter[0] += 1
    kw.setdefault("name", f"pol_{_counter[0]}")
    return de.Variable(dim=2, devices=["/CPU:0"] * shards, **kw)


def _status(policy):
    keys, scores = policy.status.export()
    return dict(zip(keys.numpy().tolist(), scores.numpy().tolist()))


def _batches(seed, n=12, high=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, size=(rng.integers(1, 4), rng.integers(1, 6))).tolist()
            for _ in range(n)]


def _reference_counts(batches):
    counts = {}
    for b in batches:
        for k in set(np.ravel(b).tolist()):  # once per batch
            counts[k] = counts.get(k, 0) + 1
    return counts


def _reference_last(batches):
    return {k: i for i, b in enumerate(batches) for k in np.ravel(b).tolist()}


def _expected_kept(score_of, keys, shards, num_reserved, partition=de.default_partition_fn):
    """Per shard, its share of num_reserved keys, best score first and the smaller key first."""
    keys = np.array(sorted(keys), np.int64)
    parts = partition(tf.constant(keys), shards).numpy()
    kept = set()
    for i in range(shards):
        share = num_reserved // shards + (1 if i < num_reserved % shards else 0)
        mine = sorted(keys[parts == i].tolist(), key=lambda k: (-score_of(k), k))
        kept.update(mine[:share])
    return kept


def test_frequency_counts_each_id_once_per_batch_tfra_example():
    v = _var(restrict_policy=de.FrequencyRestrictPolicy)
    v.restrict_policy.apply_update(tf.constant([[1, 2], [3, 3]], tf.int64))
    assert _status(v.restrict_policy) == {1: 1, 2: 1, 3: 1}
    v.restrict_policy.apply_update(tf.constant([3, 3, 4], tf.int64))
    assert _status(v.restrict_policy) == {1: 1, 2: 1, 3: 2, 4: 1}
    np.testing.assert_array_equal(v.restrict_policy.status.lookup([[3, 9]]).numpy(), [[2, 0]])
    assert int(v.restrict_policy.status.size()) == 4
    assert int(v.size()) == 0  # the status is not the variable


@pytest.mark.parametrize("policy, alias", [(de.FrequencyRestrictPolicy, "freq_var"),
                                           (de.TimestampRestrictPolicy, "tstp_var")])
def test_tfra_status_attribute_names(policy, alias):
    """TFRA code reads the status as policy.freq_var / policy.tstp_var."""
    v = _var(2, restrict_policy=policy)
    for ids in ([[1, 2], [3, 3]], [3, 4]):
        v.restrict_policy.apply_update(tf.constant(ids, tf.int64))
    keys, scores = getattr(v.restrict_policy, alias).export()
    assert dict(zip(keys.numpy().tolist(), scores.numpy().tolist())) == _status(v.restrict_policy)
    assert sorted(keys.numpy().tolist()) == [1, 2, 3, 4]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("in_function", [False, True])
def test_frequency_status_matches_reference(shards, in_function):
    v = _var(shards, restrict_policy=de.FrequencyRestrictPolicy)
    update = v.restrict_policy.apply_update
    if in_function:
        update = tf.function(update)
    batches = _batches(1)
    for b in batches:
        update(tf.constant(b, tf.int64))
    assert _status(v.restrict_policy) == _reference_counts(batches)


def _raw_stamps(policy):
    """key -> the status table's last_update (microseconds), over every status shard."""
    out = {}
    for shard in policy.status_variable.tables:
        page = ops.export_table(shard.resource, tf.int64, 1)
        out.update(zip(page["keys"].numpy().tolist(), page["last_update"].numpy().tolist()))
    return out


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("in_function", [False, True])
def test_timestamp_status_holds_wall_clock_seconds(shards, in_function):
    """TFRA's status holds int32(tf.timestamp()) of a key's last update: seconds since the
    epoch. Reference: Python's clock read around each update."""
    v = _var(shards, restrict_policy=de.TimestampRestrictPolicy)
    update = v.restrict_policy.apply_update
    if in_function:
        update = tf.function(update)
    window = {}
    for ids in ([1, 2, 3], [3, 4], [5]):
        before = time.time()
        update(tf.constant(ids, tf.int64))
        after = time.time()
        window.update({k: (before, after) for k in ids})
    stamps = _status(v.restrict_policy)
    assert set(stamps) == set(window)
    for k, (before, after) in window.items():
        assert int(before) <= stamps[k] <= int(after), (k, stamps[k], before, after)
    looked_up = v.restrict_policy.tstp_var.lookup(tf.constant([[5, 1], [9, 4]], tf.int64))
    np.testing.assert_array_equal(looked_up.numpy(), [[stamps[5], stamps[1]], [0, stamps[4]]])


@pytest.mark.parametrize("shards", [1, 3])
def test_timestamp_order_follows_update_order(shards):
    """Within one second too: the raw stamps (microseconds, the clock moved to the wall clock
    before each update) order keys exactly as their last updates, across shards."""
    v = _var(shards, restrict_policy=de.TimestampRestrictPolicy)
    batches = _batches(2)
    for b in batches:
        v.restrict_policy.apply_update(tf.constant(b, tf.int64))
    stamps, last = _raw_stamps(v.restrict_policy), _reference_last(batches)
    assert set(stamps) == set(last)
    for a in last:
        for b in last:
            assert (stamps[a] < stamps[b]) == (last[a] < last[b])
            assert (stamps[a] == stamps[b]) == (last[a] == last[b])


def test_upsert_does_not_touch_the_status():
    v = _var(restrict_policy=de.FrequencyRestrictPolicy)
    v.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    assert _status(v.restrict_policy) == {}


@pytest.mark.parametrize("policy", ["frequency", "timestamp"])
@pytest.mark.parametrize("shards", [1, 2])
def test_restriction_without_optimizer_keeps_best_keys(policy, shards):
    cls = de.FrequencyRestrictPolicy if policy == "frequency" else de.TimestampRestrictPolicy
    v = _var(shards, restrict_policy=cls)
    batches = _batches(3)
    keys = sorted(_reference_counts(batches))
    v.upsert(tf.constant(keys, tf.int64), tf.ones([len(keys), 2]))
    for b in batches:
        v.restrict_policy.apply_update(tf.constant(b, tf.int64))
    ref = _reference_counts(batches) if policy == "frequency" else _reference_last(batches)
    expected = _expected_kept(ref.get, keys, shards, 7)
    assert int(v.restrict(7, trigger=len(keys))) == 0  # not above the trigger
    removed = v.restrict(7)
    assert int(removed) == len(keys) - 7
    assert set(v.export()[0].numpy().tolist()) == expected
    assert set(_status(v.restrict_policy)) == expected


def _tfra_restrict(var_keys, status, shards, residue, partition=de.default_partition_fn):
    """TFRA 0.8.1's restriction (restrict_policies.py, _cond_apply_restriction), in numpy: when
    the Variable holds more than ``residue`` keys, each shard removes its
    ``len(status keys) - int(residue / shards)`` lowest-scored *status* keys (top_k of -score);
    keys without status are never removed. ``status``: key -> score (distinct scores, so
    top_k's choice among ties does not arise). Returns the keys it removes (from the Variable
    and the status)."""
    if len(var_keys) <= residue:
        return set()
    keys = np.array(sorted(status), np.int64)
    parts = partition(tf.constant(keys), shards).numpy() if len(keys) else keys
    removed = set()
    for i in range(shards):
        mine = sorted(keys[parts == i].tolist(), key=status.get)  # lowest score first
        removed.update(mine[:max(len(mine) - int(residue / shards), 0)])
    return removed


@pytest.mark.parametrize("policy", [de.FrequencyRestrictPolicy, de.TimestampRestrictPolicy])
@pytest.mark.parametrize("shards", [1, 2])
def test_restrict_keeps_keys_the_policy_never_saw_as_tfra(policy, shards):
    """Issue 24: upsert 100 keys, then 50 more, no training (the policy saw none of them):
    restrict(50) removes none, as TFRA 0.8.1 (it only removes status keys); it used to remove
    100 and keep 50 of the oldest."""
    v = _var(shards, restrict_policy=policy)
    v.upsert(tf.constant(np.arange(100), tf.int64), tf.ones([100, 2]))
    v.upsert(tf.constant(np.arange(100, 150), tf.int64), tf.ones([50, 2]))
    assert _tfra_restrict(list(range(150)), {}, shards, 50) == set()
    want = set(range(150))
    assert int(v.restrict(50)) == 0
    assert set(v.export()[0].numpy().tolist()) == want
    assert int(v.size()) == 150


@pytest.mark.parametrize("policy", ["frequency", "timestamp"])
@pytest.mark.parametrize("shards", [1, 2])
def test_restrict_with_and_without_status_matches_tfra(policy, shards):
    """60 keys upserted, 30 of them (and 6 never upserted) seen by apply_update with distinct
    scores: the rows left equal TFRA's restriction of the same state; only status keys go."""
    cls = de.FrequencyRestrictPolicy if policy == "frequency" else de.TimestampRestrictPolicy
    v = _var(shards, restrict_policy=cls)
    v.upsert(tf.constant(np.arange(60), tf.int64), tf.ones([60, 2]))
    seen = np.random.default_rng(5).permutation(np.arange(30, 66))  # 60..65: status only
    score = {}
    for rank, k in enumerate(seen.tolist()):  # key seen rank + 1 times / at time rank
        for _ in range(rank + 1 if policy == "frequency" else 1):
            v.restrict_policy.apply_update(tf.constant([k], tf.int64))
        score[k] = rank
    gone = _tfra_restrict(list(range(60)), score, shards, 10)
    assert len(gone) == 26 and set(range(30)).isdisjoint(gone)
    removed = v.restrict(10)
    assert set(v.export()[0].numpy().tolist()) == set(range(60)) - gone
    assert int(removed) == len(gone - set(range(60, 66)))
    assert set(_status(v.restrict_policy)) == set(score) - gone


@pytest.mark.parametrize("shards", [1, 2])
def test_optimizer_updates_status_and_restriction_keeps_slots(shards):
    v = _var(shards, restrict_policy=de.FrequencyRestrictPolicy)
    batches = _batches(4, n=8, high=20)
    train_sum_loss(v, batches, keras.optimizers.Adam(0.1))
    counts = _reference_counts(batches)
    assert _status(v.restrict_policy) == counts
    expected = _expected_kept(counts.get, list(counts), shards, 5)
    v.restrict(5)
    assert set(v.export()[0].numpy().tolist()) == expected
    for slot in v.get_slot_variables():
        assert set(slot.export()[0].numpy().tolist()) == expected


def test_restriction_in_function():
    v = _var(2, restrict_policy=de.TimestampRestrictPolicy)
    keys = list(range(10))
    v.upsert(tf.constant(keys, tf.int64), tf.ones([10, 2]))
    for k in keys:
        v.restrict_policy.apply_update(tf.constant([k], tf.int64))
    removed = tf.function(lambda: v.restrict(4))()
    assert int(removed) == 6
    assert set(v.export()[0].numpy().tolist()) == _expected_kept(lambda k: k, keys, 2, 4)


def test_status_is_checkpointed_with_the_variable(tmp_path):
    v = _var(2, restrict_policy=de.FrequencyRestrictPolicy)
    v.restrict_policy.apply_update(tf.constant([1, 2, 2, 3], tf.int64))
    v.restrict_policy.apply_update(tf.constant([2, 3], tf.int64))
    path = tf.train.Checkpoint(emb=v).save(str(tmp_path / "ckpt"))
    other = _var(2, restrict_policy=de.FrequencyRestrictPolicy)
    tf.train.Checkpoint(emb=other).restore(path)
    assert _status(other.restrict_policy) == {1: 1, 2: 2, 3: 2}


# ---- slot views ---------------------------------------------------------------------------------
def test_slots_show_only_keys_the_optimizer_updated():
    v = _var()
    v.upsert(tf.constant([1, 2, 3, 4, 5], tf.int64), tf.ones([5, 2]))
    opt = train_sum_loss(v, [[2, 4, 4]], keras.optimizers.Adam(0.1, beta_1=0.9, beta_2=0.999))
    slots = {s.slot_name: s for s in v.get_slot_variables(opt)}
    assert sorted(slots) == ["momentum", "velocity"]
    # Reference: one Adam step from m = v = 0 with gradient g: m = 0.1 g, v = 0.001 g^2;
    # key 4 appears twice, so its gradient is 2.
    g = {2: 1.0, 4: 2.0}
    for name, factor, power in (("momentum", 0.1, 1), ("velocity", 0.001, 2)):
        keys, values = slots[name].export()
        got = dict(zip(keys.numpy().tolist(), values.numpy().tolist()))
        assert sorted(got) == [2, 4]
        for k, row in got.items():
            np.testing.assert_allclose(row, [factor * g[k] ** power] * 2, rtol=1e-6)
        assert int(slots[name].size()) == 2
    v.upsert(tf.constant([6], tf.int64), tf.ones([1, 2]))  # an upsert trains nothing
    assert int(slots["momentum"].size()) == 2


def test_slot_lookup_of_untrained_key_is_the_initial_slot():
    v = _var()
    train_sum_loss(v, [[1]], keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25))
    slot = v.get_slot_variables()[0]
    v.upsert(tf.constant([7], tf.int64), tf.ones([1, 2]))
    np.testing.assert_allclose(slot.lookup([7, 99]).numpy(), np.full([2, 2], 0.25))
    np.testing.assert_allclose(slot.lookup([1]).numpy(), np.full([1, 2], 1.25))  # 0.25 + 1^2
    assert slot.export()[0].numpy().tolist() == [1]


def test_get_slot_variables_of_another_optimizer_is_empty():
    v = _var()
    opt = train_sum_loss(v, [[1]], keras.optimizers.Adam(0.1))
    assert [s.name for s in v.get_slot_variables(opt)] == [f"{v.name}/momentum",
                                                           f"{v.name}/velocity"]
    assert v.get_slot_variables(keras.optimizers.Adam(0.1)) == []


def test_keras_fit_updates_the_status():
    """model.fit runs the optimizer step in a tf.function: the status still counts each id once
    per batch."""
    layer = de.keras.layers.Embedding(2, restrict_policy=de.FrequencyRestrictPolicy, name="fitpol")
    inputs = keras.Input([3], dtype="int64")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.ops.sum(layer(inputs), axis=1)))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), "mse")
    x = np.array([[1, 2, 2], [3, 1, 1], [4, 4, 4], [2, 5, 6]], np.int64)
    model.fit(x, np.zeros([4, 1]), batch_size=2, epochs=2, shuffle=False, verbose=0)
    batches = [x[:2], x[2:]] * 2
    assert _status(layer.params.restrict_policy) == _reference_counts(batches)
