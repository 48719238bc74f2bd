"""The gradient route from a lookup to the core's fused optimizer.

A ``TrainableWrapper`` is a trainable Keras variable of shape ``(0, dim)`` that holds nothing: it
is an *anchor*. A training-mode lookup returns the rows it read from the table through an identity
with a custom gradient that takes the anchor as an extra input. Backpropagation therefore gives
the anchor a gradient, and that gradient is a ``tf.IndexedSlices`` whose ``indices`` are the
looked-up **keys** (not positions) and whose ``values`` are the per-occurrence row gradients —
exactly what a dense ``keras.layers.Embedding`` receives for ``ops.take``, except that the indices
are table keys. Several lookups through the same anchor in one step concatenate their slices.

``DynamicEmbeddingOptimizer`` recognises anchors among the variables it is given, and sends each
anchor's slices to the core's fused optimizer (``apply_gradients`` op), which sums duplicate keys
and inserts new keys with their optimizer slots. Everything else goes to the wrapped Keras
optimizer. Nothing is written by the lookup itself, and the anchor is an ordinary tracked Keras
weight, so this works the same in eager mode, in ``tf.function``, with a ``GradientTape`` loop and
in ``model.fit`` — one code path.
"""

from __future__ import annotations

import re
import weakref

import keras
import tensorflow as tf

from dualemb.tf import ops
from dualemb.tf.saving import weights_snapshot


def _variable_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "trainable"


class TrainableWrapper(keras.Variable):
    """The gradient anchor of one (Variable, name) pair: a trainable ``(0, dim)`` Keras variable.

    ``params`` is the dynamic embedding ``Variable`` it trains. Pass it (or the Keras layer that
    owns it) to ``DynamicEmbeddingOptimizer``-wrapped optimizers like any trainable variable;
    a plain Keras optimizer cannot apply its key-indexed gradient.
    """

    def __init__(self, params, name: str):
        self._de_params = params
        self._de_name = name
        with tf.init_scope():
            # A TF tensor, not a numpy array: under MultiWorkerMirroredStrategy TF 2.21's
            # chief segfaults broadcasting the initial value of a zero-size variable made from
            # numpy (tests/tf/distribute/jobs/zero_size_broadcast.py), not one made from tf.zeros.
            super().__init__(initializer=tf.zeros((0, params.dim), tf.float32),
                             shape=(0, params.dim), dtype="float32",
                             trainable=bool(params.trainable), name=_variable_name(name))
        # A plain Keras optimizer hands such variables their gradient through assign() (and
        # skips its own update math for them), where a clear error can be raised; a
        # DynamicEmbeddingOptimizer takes them out first.
        self.overwrite_with_gradient = True
        # The tf.Variable this Keras variable holds knows its anchor: TF1 / legacy Keras
        # ``minimize`` without a var_list returns the variables its tape watched, i.e. that one.
        self.value._de_held_by = weakref.ref(self)

    def __tf_tracing_type__(self, context):
        # As an argument of a tf.function the anchor is passed as itself (its variable is
        # captured), as TFRA's ResourceVariable-based ShadowVariable is; Keras' default would
        # turn it into a tensor, and the lookup could no longer find its table.
        return _ByIdentity(self)

    def assign(self, value):
        if isinstance(value, tf.IndexedSlices):
            raise TypeError(
                f"the gradient of dynamic embedding {self._de_params.name!r} (trainable "
                f"{self._de_name!r}) was given to a plain Keras optimizer: wrap it with "
                "de.DynamicEmbeddingOptimizer(optimizer), which applies it to the table")
        # The anchor holds nothing; what set_weights means for it is "restore the table"
        # (saving/weights_snapshot.py), and a value that cannot do that must not be ignored.
        weights_snapshot.restore(self._de_params, value)
        return self

    def _restore_from_tensors(self, restored_tensors):
        # A TF object checkpoint holds the anchor's (0, dim) nothing; the table is restored from
        # its de.Variable's own entry. Keras restores a variable whose value cannot restore
        # itself (a MirroredVariable under Mirrored/MultiWorkerMirroredStrategy) through
        # assign(), which refuses plain arrays (set_weights must not silently skip the table):
        # answer the checkpoint here instead.
        value = restored_tensors.get("VARIABLE_VALUE")
        if value is not None and value.shape.rank == 2 and value.shape[0] == 0 \
                and value.shape[1] == self._de_params.dim:
            return tf.no_op()
        return super()._restore_from_tensors(restored_tensors)

    def numpy(self):
        """A ``TableSnapshot``: the ``(0, dim)`` anchor value carrying a copy of the table, so
        ``model.get_weights()`` / ``set_weights()`` (EarlyStopping's restore_best_weights) include
        the table."""
        return weights_snapshot.take(self._de_params)

    # Whether this anchor keeps what lookups through it read: then a training-mode lookup calls
    # ``record_lookup(keys, rows)`` and the optimizer step ``after_update()`` (a
    # ``ShadowVariable`` does; a plain anchor keeps nothing).
    keeps_lookups = False

    @property
    def params(self):
        """The dynamic embedding ``Variable`` this anchor trains."""
        return self._de_params

    @property
    def de_name(self) -> str:
        return self._de_name


class _ByIdentity(tf.types.experimental.TraceType):
    """tf.function trace type of an object passed through by identity (one trace per object)."""

    def __init__(self, obj):
        self._ref = weakref.ref(obj)
        self._id = id(obj)

    def is_subtype_of(self, other):
        return self == other

    def most_specific_common_supertype(self, others):
        return self if all(self == o for o in others) else None

    def placeholder_value(self, placeholder_context=None):
        return self._ref()

    def cast(self, value, cast_context):
        return value

    def __eq__(self, other):
        return (isinstance(other, _ByIdentity) and self._id == other._id
                and self._ref() is other._ref())

    def __hash__(self):
        return self._id


def anchor_holding(variable):
    """The Keras 3 anchor whose tf.Variable ``variable`` is, or None."""
    ref = getattr(variable, "_de_held_by", None) if isinstance(variable, tf.Variable) else None
    return None if ref is None else ref()


def is_trainable_wrapper(variable) -> bool:
    return isinstance(variable, TrainableWrapper)


def mark_keras2_anchor(variable, params, name: str):
    """Makes ``variable`` — a trainable ``tf.Variable`` of shape ``(0, dim)``, the weight a
    tf_keras layer creates with ``add_weight`` (tf_keras tracks only ``tf.Variable`` weights, not
    Keras 3 ones) — the gradient anchor of ``params`` under ``name``: lookups under ``name``
    attach their gradient to it and the tf_keras / ``tf.compat.v1`` optimizer wrapper
    (``optimizers/legacy_wrapper.py``) routes it to the table."""
    if not isinstance(variable, tf.Variable) or tuple(variable.shape) != (0, params.dim):
        raise TypeError(f"a tf_keras anchor must be a tf.Variable of shape (0, {params.dim}), "
                        f"got {variable!r}")
    variable._de_params = params
    variable._de_name = name
    params.trainable_store[name] = variable
    return variable


def is_anchor(variable) -> bool:
    """Whether ``variable`` is a gradient anchor: a Keras 3 ``TrainableWrapper`` or a tf_keras
    layer's ``tf.Variable`` anchor (``mark_keras2_anchor``)."""
    return isinstance(variable, TrainableWrapper) or (
        isinstance(variable, tf.Variable) and getattr(variable, "_de_params", None) is not None)


def anchor_params(variable):
    """The dynamic embedding ``Variable`` an anchor trains (see ``is_anchor``)."""
    return variable.params if isinstance(variable, TrainableWrapper) else variable._de_params


def trainable_wrapper_filter(iterable, test_unaggregated_function=None):
    """(dense, dynamic-embedding) split of variables or (gradient, variable) pairs, as TFRA's."""
    dense, sparse = [], []
    for item in iterable:
        var = item[1] if isinstance(item, (tuple, list)) and len(item) == 2 else item
        (sparse if is_anchor(var) else dense).append(item)
    return tuple(dense), tuple(sparse)


# Registered once, by op name. (tf.custom_gradient would register a new gradient function in TF's
# global registry on every trace, never removed: the traced train step, and every table handle it
# captured, would then stay alive for the life of the process.)
try:
    @tf.RegisterGradient("DualembRowsWithKeyGradient")
    def _key_gradient(op, dy):
        """The gradient of ``rows`` goes to ``anchor`` as IndexedSlices over the table keys."""
        keys = op.inputs[2]
        if isinstance(dy, tf.IndexedSlices):
            values, indices = dy.values, tf.gather(keys, dy.indices)
        else:
            # An op in the gradient's graph (not the forward tensor itself): when the lookup ran
            # in a tf.function and the tape is outside, the backward function must capture the
            # keys, and returning the forward tensor as is fails to ("Node ... belong to a
            # different graph?").
            values, indices = dy, tf.identity(keys)
        return tf.IndexedSlices(tf.cast(values, tf.float32), indices), None, None
except KeyError:  # already registered (module reloaded)
    pass


def attach_gradient(wrapper: TrainableWrapper, rows, keys):
    """``rows`` [n, dim] looked up for the flat ``keys`` [n], connected to ``wrapper``."""
    # A read of the anchor: the tape watches it. (A tf_keras anchor is a tf.Variable, whose
    # ``value`` is a method.)
    value = wrapper.value if isinstance(wrapper, TrainableWrapper) else wrapper
    anchor = tf.convert_to_tensor(value)
    if anchor.dtype != tf.float32:
        # Under a float16/bfloat16 policy Keras reads variables autocast. The gradient's values
        # come from the layer's compute-dtype output, so the round trip through it is exact.
        anchor = tf.cast(anchor, tf.float32)
    return ops.rows_with_key_gradient(anchor, rows, keys)
