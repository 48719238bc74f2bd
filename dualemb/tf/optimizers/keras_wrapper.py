"""``DynamicEmbeddingOptimizer``: a Keras 3 optimizer that also trains dynamic embeddings.

``DynamicEmbeddingOptimizer(keras.optimizers.Adam(...))`` returns a
``DynamicEmbeddingOptimizerWrapper`` around the optimizer it is given, which it leaves as it is
(class, attributes, variables), the way Keras' ``LossScaleOptimizer`` wraps one. Per gradient:

- a dense variable's goes to the wrapped optimizer (``inner_optimizer``);
- a ``TrainableWrapper``'s (``IndexedSlices`` over table keys, see ``trainable.py``) goes to the
  core's fused optimizer, defined exactly as the Keras optimizer, with its hyper-parameters, its
  current learning rate (schedules included) and ``step = iterations + 1``; duplicate keys are
  summed and new keys inserted with their slots.

``iterations``, ``learning_rate``, public hyper-parameters and ``variables`` are the wrapped
optimizer's (preceded by the loss-scaling state when it is on), so files written before the
wrapper existed still load. The wrapped optimizer's gradient options (``clipnorm``,
``clipvalue``, ``global_clipnorm``, ``weight_decay``, ``loss_scale_factor``) act on embedding
gradients as Keras acts on a dense variable's; ``gradient_accumulation_steps`` raises
``NotImplementedError``. The wrapper is itself a ``LossScaleOptimizer`` (so ``model.compile``
under ``mixed_float16`` leaves it alone) and does dynamic loss scaling with Keras' rules when
given one or made under that policy. Only the rows in the batch are updated, as in TFRA. Every
rule, with what differs from a dense variable: docs/tf.md ("Training: how gradients reach the
table"). Private Keras attributes are read through ``dualemb/tf/keras_adapter.py``.
"""

from __future__ import annotations

import contextlib
import copy

import keras
import tensorflow as tf

from dualemb.tf.optimizers import legacy_wrapper as legacy_optimizer
from dualemb.tf.optimizers import fused_specs as optimizer_specs
from dualemb.tf import keras_adapter
from dualemb.tf.optimizers import row_update
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


# The wrapped optimizer's gradient options, which the wrapper applies itself to the dense and the
# embedding gradients together before handing the dense ones over.
_GRADIENT_OPTIONS = ("loss_scale_factor", "clipnorm", "global_clipnorm", "clipvalue")


@contextlib.contextmanager
def _gradient_options_off(optimizer):
    """Turns the wrapped optimizer's gradient options off for one ``apply`` (a trace-time Python
    setting, restored on exit): the gradients it gets were already unscaled and clipped."""
    saved = {k: getattr(optimizer, k) for k in _GRADIENT_OPTIONS}
    try:
        for k in _GRADIENT_OPTIONS:
            object.__setattr__(optimizer, k, None)
        yield
    finally:
        for k, v in saved.items():
            object.__setattr__(optimizer, k, v)


def _all_finite(tensors):
    flags = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors]
    return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def _values(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _forwarded(name):
    """A gradient option of the wrapper that is the wrapped optimizer's (reading and setting it
    on the wrapper reads and sets it there, so none is silently ignored)."""

    def get(self):
        inner = self.__dict__.get("inner_optimizer")
        return None if inner is None else getattr(inner, name)

    def set(self, value):
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:
            setattr(inner, name, value)
        # else: Optimizer.__init__ setting its defaults before the optimizer is attached.

    return property(get, set, doc=f"The wrapped optimizer's ``{name}``.")


@keras.saving.register_keras_serializable(package="dualemb")
class DynamicEmbeddingOptimizerWrapper(keras.optimizers.LossScaleOptimizer):
    """A Keras 3 optimizer that trains dynamic embeddings in the core and everything else with
    ``inner_optimizer``; made by ``DynamicEmbeddingOptimizer(optimizer)``. It is a
    ``LossScaleOptimizer`` so that ``model.compile`` never wraps it in Keras' own (see the module
    docstring); ``dynamic_loss_scale`` says whether it scales the loss. ``multi_table`` (default
    True): one step updates the tables of several Variables with one multi-table op where they
    allow it (``dualemb/tf/optimizers/row_update.py``: the grouping rule; the results are those
    of one op per table bit for bit); False gives every table its own op."""

    def __init__(self, inner_optimizer, bp_v2=False, dynamic_loss_scale=False,
                 initial_scale=2.0 ** 15, dynamic_growth_steps=2000, name=None,
                 multi_table=True, **kwargs):
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}; set gradient options "
                            "(clipnorm, weight_decay, ...) on the wrapped optimizer")
        _check_wrappable(inner_optimizer)
        # Not LossScaleOptimizer.__init__: it would set the wrapped optimizer's
        # loss_scale_factor to None, and the wrapper changes nothing on the optimizer it wraps.
        keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self.bp_v2 = bool(bp_v2)
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        self.initial_scale = float(initial_scale)
        self.dynamic_growth_steps = int(dynamic_growth_steps)
        self.multi_table = bool(multi_table)

    # ---- what Keras and users read --------------------------------------------------------------
    weight_decay = _forwarded("weight_decay")
    clipnorm = _forwarded("clipnorm")
    clipvalue = _forwarded("clipvalue")
    global_clipnorm = _forwarded("global_clipnorm")
    loss_scale_factor = _forwarded("loss_scale_factor")

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def set_weights(self, weights):
        if not self.built:
            raise ValueError("build the optimizer before set_weights()")
        variables = self.variables
        if len(weights) != len(variables):
            raise ValueError(f"set_weights got {len(weights)} arrays for {len(variables)} "
                             "optimizer variables")
        for variable, weight in zip(variables, weights):
            if tuple(variable.shape) != tuple(weight.shape):
                raise ValueError(f"optimizer variable {variable.path} has shape "
                                 f"{tuple(variable.shape)}, got {tuple(weight.shape)}")
        for variable, weight in zip(variables, weights):
            variable.assign(weight)

    def __getattr__(self, name):
        # Public hyper-parameters of the wrapped optimizer (beta_1, momentum, weight_decay, ...),
        # as they were readable on the optimizer before it was wrapped. Private names are not
        # forwarded: Keras probes them on the wrapper itself.
        if name.startswith("_") or name == "inner_optimizer":
            raise AttributeError(name)
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def variables(self):
        own = [self.step_counter, self.dynamic_scale] if self._scaling_built() else []
        return own + list(self.inner_optimizer.variables)

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    def _get_current_learning_rate(self):
        return keras_adapter.current_learning_rate(self.inner_optimizer)

    def _scaling_built(self) -> bool:
        return self.dynamic_loss_scale and self.built

    def scale_loss(self, loss):
        if not self.dynamic_loss_scale:
            return self.inner_optimizer.scale_loss(loss)
        scale = self.dynamic_scale if self.built else self.initial_scale
        return loss * tf.cast(scale, loss.dtype)

    # ---- Keras hooks --------------------------------------------------------------------------
    def build(self, var_list):
        """Builds the wrapped optimizer on the dense variables only (embedding rows keep their
        optimizer state in the core table), and the loss-scaling state if scaling is on."""
        if self.dynamic_loss_scale:
            self._build_loss_scale()
        dense = [v for v in var_list if not is_trainable_wrapper(v)]
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(dense)
        keras.optimizers.Optimizer.build(self, var_list)

    def _build_loss_scale(self):
        # As LossScaleOptimizer.build, under the same names.
        self.step_counter = self.add_variable(
            shape=(), dtype="int", initializer=keras.initializers.Zeros(),
            aggregation="none", name="step_counter")
        self.dynamic_scale = self.add_variable(
            shape=(), dtype="float32", initializer=keras.initializers.Constant(self.initial_scale),
            aggregation="none", name="dynamic_scale")

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError("DynamicEmbeddingOptimizer runs on the TensorFlow backend, "
                                  "whose optimizers update their variables in place")

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(
            [v for v in var_list if not is_trainable_wrapper(v)])

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "bp_v2": self.bp_v2,
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "initial_scale": self.initial_scale,
            "dynamic_growth_steps": self.dynamic_growth_steps,
            "multi_table": self.multi_table,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        # A copy: Keras' optimizers deserialize their learning-rate schedule in place.
        inner = keras.saving.deserialize_keras_object(copy.deepcopy(config.pop("inner_optimizer")),
                                                      custom_objects=custom_objects)
        return cls(inner, **config)

    # ---- the step -------------------------------------------------------------------------------
    def apply(self, grads, trainable_variables=None, step=None):
        """Applies one step. ``step`` (1-based int64 scalar, optional): the step number the fused
        embedding update uses (bias corrections, learning-rate schedules) instead of
        ``iterations + 1``. Without it, ``iterations`` is read as Keras reads it for the dense
        weights, also under ``ParameterServerStrategy``: exact with one worker (its steps run one
        after another), approximate with several, whose steps read and increment ``iterations``
        concurrently (increments get lost); there the coordinator passes each scheduled step its
        number to be exact (see docs/scaling_tf.md)."""
        if trainable_variables is None:
            if not self.built:
                raise ValueError("DynamicEmbeddingOptimizer: pass the variables with the "
                                 "gradients (or build the optimizer first)")
            trainable_variables = keras_adapter.built_trainable_variables(self)
        grads, variables = list(grads), list(trainable_variables)
        if not grads:
            return  # as Keras: nothing to apply
        if len(grads) != len(variables):
            raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")
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
                    group = groups[id(var.params)] = row_update.Group(var.params)
                group.add(var, grad)
            else:
                dense_grads.append(grad)
                dense_vars.append(var)
        groups = list(groups.values())
        for group in groups:
            group.finish()

        if not self.dynamic_loss_scale:
            self._step(groups, dense_grads, dense_vars, self.inner_optimizer.loss_scale_factor,
                       step)
            return
        finite = _all_finite([tf.cast(_values(g), tf.float32) for g in dense_grads]
                             + [g.values for g in groups])

        def finite_step():
            self._step(groups, dense_grads, dense_vars, self.dynamic_scale, step)
            grow = tf.equal(self.step_counter, self.dynamic_growth_steps - 1)
            self.step_counter.assign(tf.where(grow, tf.zeros_like(self.step_counter),
                                              self.step_counter + 1))
            self.dynamic_scale.assign(tf.where(grow, self.dynamic_scale * 2.0,
                                               self.dynamic_scale))

        def skipped_step():
            self.step_counter.assign(tf.zeros_like(self.step_counter))
            self.dynamic_scale.assign(self.dynamic_scale * 0.5)

        tf.cond(finite, finite_step, skipped_step)

    def _step(self, groups, dense_grads, dense_vars, scale, given_step=None):
        """One update: embedding rows in the core, dense variables by the wrapped optimizer
        (which increments ``iterations``)."""
        inner = self.inner_optimizer
        if groups and inner.gradient_accumulation_steps:
            raise NotImplementedError("DynamicEmbeddingOptimizer does not support "
                                      "gradient_accumulation_steps")
        with tf.name_scope(self.name):
            if given_step is None:
                learning_rate = tf.cast(keras_adapter.current_learning_rate(inner), tf.float32)
                step = tf.cast(keras_adapter.step_counter(inner), tf.int64) + 1
            else:  # the caller's step, for the schedule too (as Keras evaluates it at step - 1)
                step = tf.cast(given_step, tf.int64)
                learning_rate = keras_adapter.learning_rate_setting(inner)
                if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
                    learning_rate = learning_rate(step - 1)
                learning_rate = tf.cast(learning_rate, tf.float32)
            dense_grads = self._preprocess(groups, dense_grads, scale)
            for group in groups:
                self._attach(group)
            row_update.fused_steps(groups, learning_rate, step, self.multi_table)
        if dense_vars:
            with _gradient_options_off(inner):
                inner.apply(dense_grads, dense_vars)  # also increments iterations
        else:
            keras_adapter.step_counter(inner).assign_add(1)

    # ---- embedding gradients -------------------------------------------------------------------
    def _preprocess(self, groups, dense_grads, scale):
        """Unscales (by ``scale``) and clips the embedding values and the dense gradients
        together, with Keras' rules and the wrapped optimizer's options; returns the dense
        gradients."""
        inner = self.inner_optimizer
        clipping = any(c is not None and c > 0
                       for c in (inner.clipnorm, inner.global_clipnorm, inner.clipvalue))
        if clipping:
            for group in groups:
                group.sum_duplicates()
        if scale is not None:
            dense_grads = [_divide(g, tf.cast(scale, _values(g).dtype)) for g in dense_grads]
            for group in groups:
                group.values = group.values / tf.cast(scale, tf.float32)
        if inner.clipnorm and inner.clipnorm > 0:
            for group in groups:
                group.values = keras_adapter.clip_by_norm(inner, group.values)
            return keras_adapter.clip_gradients(inner, dense_grads)
        if inner.global_clipnorm and inner.global_clipnorm > 0:
            squares = [_sum_of_squares(g) for g in dense_grads] + [
                _sum_of_squares(group.values) for group in groups]
            norm = tf.sqrt(tf.add_n(squares))
            clip = tf.cast(inner.global_clipnorm, tf.float32)
            factor = clip * tf.minimum(1.0 / norm, 1.0 / clip)
            factor = factor + (norm - norm)  # NaN for a non-finite norm, as Keras
            for group in groups:
                group.values = group.values * factor
            return [_scale(g, tf.cast(factor, _values(g).dtype)) for g in dense_grads]
        if inner.clipvalue and inner.clipvalue > 0:
            v = inner.clipvalue
            for group in groups:
                group.values = tf.clip_by_value(group.values, -v, v)
            return keras_adapter.clip_gradients(inner, dense_grads)
        return dense_grads

    def _attach(self, group):
        """Makes the wrapped optimizer (with weight decay where Keras would decay the Variable)
        the fused optimizer of ``group``'s tables."""
        inner = self.inner_optimizer
        decay = (inner.weight_decay is not None
                 and keras_adapter.uses_weight_decay(inner, group.wrappers[0]))
        group.params.router.attach_optimizer(optimizer_specs.fused_spec(inner, decay), self)


def _check_wrappable(optimizer) -> None:
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise TypeError("pass the LossScaleOptimizer to DynamicEmbeddingOptimizer, which takes "
                        "its inner optimizer and does the loss scaling itself")
    optimizer_specs.family_of(optimizer)  # raises the TypeError listing what is supported
    if optimizer.gradient_accumulation_steps:
        raise NotImplementedError("DynamicEmbeddingOptimizer does not support "
                                  "gradient_accumulation_steps")


def DynamicEmbeddingOptimizer(optimizer=None, bp_v2=False, synchronous=False, multi_table=True,
                              **kwargs):
    """Wraps a Keras 3 optimizer so that it trains dynamic embeddings too (TFRA's name and
    arguments); the optimizer given is not changed. Returns a
    ``DynamicEmbeddingOptimizerWrapper`` (a ``keras.optimizers.Optimizer``).

    Args:
      optimizer: a ``keras.optimizers`` SGD, Adam (amsgrad too), AdamW, Adagrad, Adamax, Nadam,
        RMSprop, Ftrl, Adadelta or Lion instance (or a subclass instance), or a
        ``keras.optimizers.LossScaleOptimizer`` around one (dynamic loss scaling, see the module
        docstring). A wrapper is returned as it is.
      bp_v2: accepted; the core's fused update is an atomic read-modify-write of each row, which
        is what bp_v2 (update by delta) protects in TFRA.
      synchronous: Horovod synchronous training is not supported (``NotImplementedError``).
      multi_table: one step updates several Variables' tables with one multi-table op where
        they allow it (same results bit for bit; docs/tf.md "Multi-table ops"); False: one op
        per table. ``DUALEMB_TF_MULTI_TABLE=0`` in the environment turns it off for every
        optimizer.
    """
    if optimizer is None:
        optimizer = kwargs.pop("self", None)
    if kwargs:
        raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
    if synchronous:
        raise NotImplementedError("DynamicEmbeddingOptimizer(synchronous=True) (Horovod) is not "
                                  "supported")
    if isinstance(optimizer, DynamicEmbeddingOptimizerWrapper) or legacy_optimizer.is_routed(
            optimizer):
        return optimizer
    api = legacy_optimizer.api_of(optimizer)  # tf_keras and TF1 optimizers
    if api is not None:
        return legacy_optimizer.wrap(optimizer, api)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return DynamicEmbeddingOptimizerWrapper(
            optimizer.inner_optimizer, bp_v2=bp_v2, dynamic_loss_scale=True,
            initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps, multi_table=multi_table)
    mixed = keras.config.dtype_policy().name == "mixed_float16"
    return DynamicEmbeddingOptimizerWrapper(optimizer, bp_v2=bp_v2, dynamic_loss_scale=mixed,
                                            multi_table=multi_table)


def is_wrapped(optimizer) -> bool:
    return isinstance(optimizer, DynamicEmbeddingOptimizerWrapper)


def _legacy_loader(base: type) -> type:
    """Reads ``dualemb>DynamicEmbedding<Base>`` entries of models saved when the wrapper changed
    the optimizer's class (their config is the optimizer's own)."""
    name = f"DynamicEmbedding{base.__name__}"

    def from_config(cls, config, custom_objects=None):
        return DynamicEmbeddingOptimizer(base.from_config(config))

    def get_config(self):  # pragma: no cover - never instantiated
        raise NotImplementedError

    cls = type(name, (), {"__module__": __name__, "from_config": classmethod(from_config),
                          "get_config": get_config,
                          "__doc__": f"Loads a saved {name} as a wrapped {base.__name__}."})
    return keras.saving.register_keras_serializable(package="dualemb", name=name)(cls)


for _family in optimizer_specs.FAMILIES:
    _legacy_loader(_family[0])
