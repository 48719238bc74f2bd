"""``DynamicEmbeddingOptimizer``: a Keras 3 optimizer that also trains dynamic embeddings.

``DynamicEmbeddingOptimizer(keras.optimizers.Adam(...))`` returns the **same optimizer object**,
its class switched to a subclass that adds the embedding route (TFRA also modifies the instance it
is given and returns it; dualemb changes nothing else, and nothing global). For every gradient it
is given:

- a dense variable's gradient goes to the wrapped optimizer, unchanged;
- a ``TrainableWrapper``'s gradient (``IndexedSlices`` over table keys, see ``trainable.py``) goes
  to the core's fused optimizer, defined exactly as the Keras optimizer, with its
  hyper-parameters, its current learning rate (schedules included: evaluated at ``iterations``)
  and ``step = iterations + 1``. The core sums the gradients of duplicate keys and inserts new
  keys, with their slots, as it updates them.

An embedding's gradient is the gradient of a dense variable holding its rows: the per-occurrence
gradients of a key are summed (TFRA's plain lookup lets the last duplicate win instead; Keras fed
the ``IndexedSlices`` of a dense ``keras.layers.Embedding`` applies its nonlinear update math per
occurrence, e.g. Adam's second moment gets the sum of squares rather than the square of the sum).
Gradient options act on that gradient as Keras acts on a dense variable's: ``clipnorm`` clips each
Variable's gradient by its L2 norm, ``clipvalue`` clips it elementwise, ``global_clipnorm`` clips
all gradients, dense and embedding, by their joint norm, and ``weight_decay`` decays the rows being
updated (``w -= w * weight_decay * lr``, before the step; ``exclude_from_weight_decay`` is
honored). ``loss_scale_factor`` unscales them first. ``use_ema`` averages the dense weights only;
``gradient_accumulation_steps`` raises ``NotImplementedError``.

**Only the rows in the batch are updated**, as in TFRA: a row's optimizer state (momentum,
Adam's moments, ...) advances only on the steps where its key occurs. A dense Keras variable
instead applies the update to every row at every step, and with momentum-style optimizers
(SGD with momentum, Adam, Adamax, Nadam, RMSprop with momentum, Lion, Adadelta) a row whose
gradient is zero at this step still moves by its accumulated momentum there. So a dense and a
dynamic embedding agree exactly on rows present at every step, and rows absent from a batch keep
their values and state until their key comes back; bias corrections use the global step.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from dualemb.core.spec import to_spec
from dualemb.tf import ops, optimizer_specs
from dualemb.tf.trainable import is_trainable_wrapper


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def _divide(grad, divisor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / divisor, grad.indices, grad.dense_shape)
    return grad / divisor


def _sum_of_squares(grad):
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    return tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))


class _Group:
    """The embedding gradients of one ``Variable`` in one step (from all its wrappers)."""

    def __init__(self, params):
        self.params = params
        self.wrappers = []
        self.keys = []
        self.values = []

    def add(self, wrapper, grad):
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                f"the gradient of dynamic embedding anchor {wrapper.de_name!r} must be the "
                f"IndexedSlices a dualemb lookup produces, got {type(grad).__name__}")
        self.wrappers.append(wrapper)
        self.keys.append(grad.indices)
        self.values.append(tf.cast(grad.values, tf.float32))

    def finish(self):
        self.keys = self.keys[0] if len(self.keys) == 1 else tf.concat(self.keys, 0)
        self.values = self.values[0] if len(self.values) == 1 else tf.concat(self.values, 0)

    def sum_duplicates(self):
        """One row per distinct key, the sum of its per-occurrence gradients (what clipping
        sees; the fused step sums duplicates itself otherwise)."""
        unique, index = tf.unique(self.keys)
        self.values = tf.math.unsorted_segment_sum(self.values, index, tf.size(unique))
        self.keys = unique


class DynamicEmbeddingOptimizerMixin:
    """Mixed in front of a Keras optimizer class by ``DynamicEmbeddingOptimizer``."""

    _de_wrapped = True

    # ---- Keras hooks ---------------------------------------------------------------------------
    def build(self, variables):
        """Builds the wrapped optimizer on the dense variables only (embedding rows keep their
        optimizer state in the core table)."""
        super().build([v for v in variables if not is_trainable_wrapper(v)])

    def _clip_gradients(self, grads):
        if getattr(self, "_de_preprocessed", False):
            return grads  # already unscaled and clipped together with the embedding gradients
        return super()._clip_gradients(grads)

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            return super().apply(grads, trainable_variables)
        grads, variables = list(grads), list(trainable_variables)
        if not any(is_trainable_wrapper(v) for v in variables):
            return super().apply(grads, variables)
        if self.gradient_accumulation_steps:
            raise NotImplementedError("DynamicEmbeddingOptimizer does not support "
                                      "gradient_accumulation_steps")
        if not self.built:
            with tf.name_scope(self.name):
                self.build(variables)
            self.built = True

        groups, dense_grads, dense_vars = {}, [], []
        for grad, var in zip(grads, variables):
            if grad is None:
                continue
            if is_trainable_wrapper(var):
                group = groups.get(id(var.params))
                if group is None:
                    group = groups[id(var.params)] = _Group(var.params)
                group.add(var, grad)
            else:
                dense_grads.append(grad)
                dense_vars.append(var)
        groups = list(groups.values())
        for group in groups:
            group.finish()

        with tf.name_scope(self.name):
            learning_rate = tf.cast(self._get_current_learning_rate(), tf.float32)
            step = tf.cast(self._iterations, tf.int64) + 1
            dense_grads = self._de_preprocess(groups, dense_grads)
            for group in groups:
                self._de_update(group, learning_rate, step)

        if dense_vars:
            # Already unscaled and clipped together with the embedding gradients: let the
            # wrapped optimizer skip both (plain attributes, set and restored at trace time).
            scale = self.loss_scale_factor
            object.__setattr__(self, "_de_preprocessed", True)
            object.__setattr__(self, "loss_scale_factor", None)
            try:
                super().apply(dense_grads, dense_vars)  # also increments iterations
            finally:
                object.__setattr__(self, "loss_scale_factor", scale)
                object.__setattr__(self, "_de_preprocessed", False)
        else:
            self._iterations.assign_add(1)

    # ---- embedding gradients -------------------------------------------------------------------
    def _de_preprocess(self, groups, dense_grads):
        """Unscales (loss_scale_factor) and clips the embedding values and the dense gradients
        together, with Keras' rules; returns the dense gradients."""
        scale = self.loss_scale_factor
        clipping = any(c is not None and c > 0
                       for c in (self.clipnorm, self.global_clipnorm, self.clipvalue))
        if clipping:
            for group in groups:
                group.sum_duplicates()
        if scale is not None:
            dense_grads = [_divide(g, scale) for g in dense_grads]
            for group in groups:
                group.values = group.values / scale
        if self.clipnorm and self.clipnorm > 0:
            for group in groups:
                group.values = self._clip_by_norm(group.values)
            return super()._clip_gradients(dense_grads)
        if self.global_clipnorm and self.global_clipnorm > 0:
            squares = [_sum_of_squares(g) for g in dense_grads] + [
                _sum_of_squares(group.values) for group in groups]
            norm = tf.sqrt(tf.add_n(squares))
            clip = tf.cast(self.global_clipnorm, tf.float32)
            factor = clip * tf.minimum(1.0 / norm, 1.0 / clip)
            factor = factor + (norm - norm)  # NaN for a non-finite norm, as Keras
            for group in groups:
                group.values = group.values * factor
            return [_scale(g, tf.cast(factor, g.dtype)) for g in dense_grads]
        if self.clipvalue and self.clipvalue > 0:
            v = self.clipvalue
            for group in groups:
                group.values = tf.clip_by_value(group.values, -v, v)
            return super()._clip_gradients(dense_grads)
        return dense_grads

    def _de_update(self, group, learning_rate, step):
        params = group.params
        decay = self.weight_decay is not None and self._use_weight_decay(group.wrappers[0])
        spec, front_end_decay = optimizer_specs.fused_spec(self, decay)
        params._attach_optimizer(spec, to_spec(spec), self)
        if front_end_decay:
            wd = tf.constant(optimizer_specs.weight_decay_of(self), tf.float32)
            unique, _ = tf.unique(group.keys)
            rows, _ = params._find_flat(unique)
            decayed = rows - rows * wd * learning_rate
            params._write_flat(ops.insert_or_assign, unique, decayed)

        def step_fn(table_id, keys, grads):
            return ops.apply_gradients(table_id, keys, grads, learning_rate, step)

        params._write_flat(step_fn, group.keys, group.values)



_WRAPPED: dict = {}


def wrapped_class(base: type) -> type:
    """The ``DynamicEmbedding<Base>`` subclass of a Keras optimizer class (made once, registered
    with Keras as ``dualemb>DynamicEmbedding<Base>`` so saved models reload it)."""
    cls = _WRAPPED.get(base)
    if cls is None:
        name = f"DynamicEmbedding{base.__name__}"
        cls = type(name, (DynamicEmbeddingOptimizerMixin, base),
                   {"__module__": __name__, "__qualname__": name,
                    "__doc__": f"{base.__name__} that also trains dualemb dynamic embeddings."})
        keras.saving.register_keras_serializable(package="dualemb", name=name)(cls)
        _WRAPPED[base] = cls
    return cls


def DynamicEmbeddingOptimizer(optimizer=None, bp_v2=False, synchronous=False, **kwargs):
    """Makes a Keras 3 optimizer train dynamic embeddings too; returns the same object.

    Args:
      optimizer: a ``keras.optimizers`` SGD, Adam (amsgrad too), AdamW, Adagrad, Adamax, Nadam,
        RMSprop, Ftrl, Adadelta or Lion instance (or a subclass instance).
      bp_v2: accepted; the core's fused update is an atomic read-modify-write of each row, which
        is what bp_v2 (update by delta) protects in TFRA.
      synchronous: Horovod synchronous training is not supported (``NotImplementedError``).
    """
    if optimizer is None:
        optimizer = kwargs.pop("self", None)
    if kwargs:
        raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
    if synchronous:
        raise NotImplementedError("DynamicEmbeddingOptimizer(synchronous=True) (Horovod) is not "
                                  "supported")
    if isinstance(optimizer, DynamicEmbeddingOptimizerMixin):
        return optimizer
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer_specs.family_of(optimizer)  # raises the TypeError listing what is supported
    optimizer_specs.family_of(optimizer)
    if optimizer.gradient_accumulation_steps:
        raise NotImplementedError("DynamicEmbeddingOptimizer does not support "
                                  "gradient_accumulation_steps")
    object.__setattr__(optimizer, "__class__", wrapped_class(type(optimizer)))
    object.__setattr__(optimizer, "_de_bp_v2", bool(bp_v2))
    return optimizer


def is_wrapped(optimizer) -> bool:
    return isinstance(optimizer, DynamicEmbeddingOptimizerMixin)


# Register the wrapped classes of the supported optimizers up front, so that a model saved with
# one reloads (keras.models.load_model) in a fresh process after `import dualemb.tf`.
for _family in optimizer_specs.FAMILIES:
    wrapped_class(_family[0])
