"""TFRA / Keras initializers -> the core's deterministic initializer specs (``to_spec``).

In the core an initial row is a pure function of (seed, key), so a key gets the same row in TF
and JAX, on any shard count (TFRA draws from a stateful RNG on every lookup instead). Accepted:
None (zeros), a number or a ``dim``-vector (TFRA's broadcast rule), the Keras 3, tf_keras,
``tf`` and ``tf.compat.v1`` normal / truncated normal / uniform / zeros / ones / constant
initializers and their string names, variance-scaling initializers (drawn for the one-key shape
``[1, dim]``, as TFRA draws for a key looked up alone), a ``dualemb.core.initializers`` spec
dict, and any other callable, called once when the Variable is made. Anything else (an
initializer without a per-key form: ``Orthogonal``, ``Identity``, ...) raises a ``TypeError``
that lists what is supported; docs/tf.md ("Semantics", Initializers) has the full list.

Seeds: an integer seed is used as is; **a seed of None becomes a fixed seed derived from the
Variable's name** (64-bit FNV-1a, masked to 63 bits), so initial rows are reproducible across runs
and frameworks, and two variables with different names differ for the same key.
"""

from __future__ import annotations

import numbers

import keras
import numpy as np
import tensorflow as tf

from dualemb.core import initializers as core_inits

SUPPORTED = ("None, a number, an array of length dim (or 1), a dualemb.core.initializers spec, "
             "keras.initializers.RandomNormal / TruncatedNormal / RandomUniform / Zeros / Ones / "
             "Constant (or their string names), or tf.random_normal_initializer / "
             "tf.random_uniform_initializer / tf.zeros_initializer / tf.ones_initializer / "
             "tf.constant_initializer, or their tf.compat.v1 forms, or tf_keras' RandomNormal / "
             "TruncatedNormal / RandomUniform / Zeros / Ones / Constant, variance-scaling "
             "initializers (GlorotUniform, HeNormal, ...), or a callable that is not an "
             "initializer object (called once, as TFRA does, for a constant default row)")

_KERAS_RANDOM = {
    keras.initializers.RandomNormal: "normal",
    keras.initializers.TruncatedNormal: "truncated_normal",
    keras.initializers.RandomUniform: "uniform",
}
_TF_RANDOM = {
    tf.random_normal_initializer: "normal",
    tf.random_uniform_initializer: "uniform",
}
try:  # TF's own v2 truncated normal (tf.initializers.* are Keras' in TF 2.21)
    from tensorflow.python.ops import init_ops_v2 as _init_ops_v2

    _TF_RANDOM[_init_ops_v2.TruncatedNormal] = "truncated_normal"
except ImportError:  # pragma: no cover
    _init_ops_v2 = None

# TF1's initializer classes (tf.compat.v1.*_initializer), which TFRA code still passes.
_V1 = tf.compat.v1
_TF_RANDOM[type(_V1.random_normal_initializer())] = "normal"
_TF_RANDOM[type(_V1.truncated_normal_initializer())] = "truncated_normal"
_TF_RANDOM[type(_V1.random_uniform_initializer())] = "uniform"
_ZEROS = (keras.initializers.Zeros, tf.zeros_initializer, type(_V1.zeros_initializer()))
_ONES = (keras.initializers.Ones, tf.ones_initializer, type(_V1.ones_initializer()))
_CONSTANT = (keras.initializers.Constant, tf.constant_initializer,
             type(_V1.constant_initializer()))


def name_seed(name: str) -> int:
    """The default seed for a Variable name: FNV-1a 64 of its UTF-8 bytes, masked to 63 bits."""
    h = 0xCBF29CE484222325
    for b in (name or "").encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def _seed(seed, name: str) -> int:
    if seed is None:
        return name_seed(name)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed) & 0x7FFFFFFFFFFFFFFF
    raise TypeError(f"initializer seed must be an int or None, got {seed!r} (a "
                    "keras.random.SeedGenerator is stateful and cannot give per-key rows)")


def _random_spec(kind: str, config: dict, name: str) -> dict:
    seed = _seed(config.get("seed"), name)
    if kind == "uniform":
        maxval = config.get("maxval", 0.05)
        if maxval is None:  # TF1's random_uniform_initializer: "defaults to 1 for float types"
            maxval = 1.0
        return core_inits.uniform(config.get("minval", -0.05), maxval, seed)
    mean, stddev = config.get("mean", 0.0), config.get("stddev", 0.05)
    if kind == "normal":
        return core_inits.normal(mean, stddev, seed)
    return core_inits.truncated_normal(mean, stddev, seed)


def _value_spec(value, dim: int) -> dict:
    # Not through float32: an int64 or float64 table would silently get a rounded default.
    arr = np.asarray(value).reshape(-1)
    if arr.dtype.kind not in "biuf":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as e:
            raise TypeError(f"initializer {value!r} is not numeric; supported: {SUPPORTED}") from e
    if arr.size == 0:
        raise ValueError("an initializer array must not be empty")
    if arr.size == dim and dim > 1:
        return core_inits.vector(arr)
    return core_inits.constant(arr[0].item())  # TFRA broadcasts the first element


_TF_KERAS_KINDS = {"RandomNormal": "normal", "TruncatedNormal": "truncated_normal",
                   "RandomUniform": "uniform", "Zeros": "zeros", "Ones": "ones",
                   "Constant": "constant"}


# tf_keras' initializers, and TF's own old copy of Keras 2 (tensorflow.python.keras, which TFRA's
# tests use).
_KERAS_TWO_MODULES = ("tf_keras.src.initializers.", "tensorflow.python.keras.initializers.")


def _tf_keras_kind(initializer):
    """The kind of a Keras 2 initializer of exactly one of the classes above (what
    ``tf.keras.initializers`` are under ``TF_USE_LEGACY_KERAS=1``), else None."""
    cls = type(initializer)
    if cls.__module__.startswith(_KERAS_TWO_MODULES):
        return _TF_KERAS_KINDS.get(cls.__name__)
    return None


def string_spec(initializer, dim: int) -> dict:
    """The default row of a string-valued Variable (``value_dtype=tf.string``): None or a zeros
    initializer -> empty strings (TF's zero of tf.string); a str/bytes -> that string in every
    column (TFRA's ``_convert_anything_to_init`` keeps only its first character: a str is
    indexable; we keep the whole string); a list / array / eager Tensor of dim strings -> that
    row, of another length -> its first element broadcast (TFRA's rule);
    ``tf.constant_initializer(s)`` -> as its value; a ``dualemb.core.initializers`` spec dict.
    Defaults are stored as JSON text, so they must be valid UTF-8."""
    if initializer is None or isinstance(initializer, dict):
        return core_inits.string_default(initializer)
    if isinstance(initializer, (str, bytes)):
        return core_inits.string_constant(initializer)
    if isinstance(initializer, (tf.Tensor, tf.Variable)):
        if not hasattr(initializer, "numpy"):
            raise TypeError("a Tensor initializer must be an eager (concrete) tensor")
        initializer = initializer.numpy()
    if isinstance(initializer, (list, tuple, np.ndarray)):
        flat = np.asarray(initializer, dtype=object).reshape(-1).tolist()
        if len(flat) == dim:
            return core_inits.string_vector(flat)
        if flat:
            return core_inits.string_constant(flat[0])
    kind_of = type(initializer)
    keras2 = _tf_keras_kind(initializer)
    if kind_of in _ZEROS or keras2 == "zeros":
        return core_inits.string_default(None)
    if kind_of in _CONSTANT or keras2 == "constant":
        return string_spec(initializer.get_config()["value"], dim)
    raise TypeError(f"unsupported initializer {initializer!r} for a string-valued Variable; "
                    "supported: None, a str/bytes, a list of dim (or 1) strings, "
                    "tf.zeros_initializer, tf.constant_initializer(str), or a spec dict")


def to_spec(initializer, dim: int, name: str = "", _depth: int = 0) -> dict:
    """The core initializer spec for a TFRA-style ``initializer`` (see the module docstring)."""
    if initializer is None:
        return core_inits.zeros()
    if isinstance(initializer, dict):
        return core_inits.canonical(initializer)
    if isinstance(initializer, str):
        try:
            initializer = keras.initializers.get(initializer)
        except ValueError as e:
            raise TypeError(f"unknown initializer {initializer!r}; supported: {SUPPORTED}") from e
    if isinstance(initializer, bool):
        raise TypeError(f"unsupported initializer {initializer!r}; supported: {SUPPORTED}")
    if isinstance(initializer, numbers.Real):
        return core_inits.constant(initializer)
    if isinstance(initializer, (list, tuple, np.ndarray)):
        return _value_spec(initializer, dim)
    if isinstance(initializer, (tf.Tensor, tf.Variable)):
        if not tf.executing_eagerly() and not hasattr(initializer, "numpy"):
            raise TypeError("a Tensor initializer must be an eager (concrete) tensor")
        return _value_spec(initializer.numpy(), dim)
    for cls, kind in list(_KERAS_RANDOM.items()) + list(_TF_RANDOM.items()):
        if type(initializer) is cls:
            return _random_spec(kind, initializer.get_config(), name)
    kind_of = type(initializer)
    keras2 = _tf_keras_kind(initializer)
    if keras2 in ("normal", "truncated_normal", "uniform"):
        return _random_spec(keras2, initializer.get_config(), name)
    if kind_of in _ZEROS or keras2 == "zeros":
        return core_inits.zeros()
    if kind_of in _ONES or keras2 == "ones":
        return core_inits.constant(1.0)
    if kind_of in _CONSTANT or keras2 == "constant":
        return _value_spec(initializer.get_config()["value"], dim)
    if _is_variance_scaling(initializer):
        return _variance_scaling_spec(initializer, dim, name)
    if callable(initializer) and not is_initializer_object(initializer) and _depth < 8:
        return to_spec(_call_as_tfra(initializer), dim, name, _depth + 1)
    raise TypeError(f"unsupported initializer {initializer!r} (type {kind_of.__name__}); "
                    f"supported: {SUPPORTED}")


# Base classes of initializer objects: TFRA redraws these on every lookup (shape [n, dim]); only
# those with a per-key form above are accepted. Any other callable is a plain function.
# (TF1's classes are found through the objects tf.compat.v1 makes, as _ZEROS above.)
_INITIALIZER_BASES = (keras.initializers.Initializer, type(_V1.zeros_initializer()).__base__) + (
    (_init_ops_v2.Initializer,) if _init_ops_v2 is not None else ())
_VARIANCE_SCALING = (keras.initializers.VarianceScaling,
                     type(_V1.variance_scaling_initializer())) + (
    (_init_ops_v2.VarianceScaling,) if _init_ops_v2 is not None else ())


def _keras2_bases(initializer) -> set:
    return {c.__name__ for c in type(initializer).__mro__
            if c.__module__.startswith(_KERAS_TWO_MODULES)}


def is_initializer_object(initializer) -> bool:
    """A Keras 3 / tf_keras / TF initializer object (as opposed to a plain function)."""
    return (isinstance(initializer, _INITIALIZER_BASES)
            or "Initializer" in _keras2_bases(initializer))


def _is_variance_scaling(initializer) -> bool:
    return (isinstance(initializer, _VARIANCE_SCALING)
            or "VarianceScaling" in _keras2_bases(initializer))


def _variance_scaling_spec(initializer, dim: int, name: str) -> dict:
    """Keras' VarianceScaling for the shape [1, dim] (fan_in 1, fan_out dim), per key. Scale,
    mode and distribution are attributes (``GlorotUniform``'s config holds only its seed); the
    seed comes from the config, where None stays None (Keras 3 draws a random one into the
    attribute)."""
    scale, mode = float(initializer.scale), initializer.mode
    fans = {"fan_in": 1.0, "fan_out": float(dim), "fan_avg": (1.0 + dim) / 2.0}
    if mode not in fans:
        raise TypeError(f"VarianceScaling mode {mode!r} is not one of {sorted(fans)}")
    variance = scale / max(1.0, fans[mode])
    distribution = initializer.distribution
    seed = _seed(initializer.get_config().get("seed"), name)
    if distribution == "uniform":
        limit = float(np.sqrt(3.0 * variance))
        return core_inits.uniform(-limit, limit, seed)
    if distribution == "untruncated_normal":
        return core_inits.normal(0.0, float(np.sqrt(variance)), seed)
    if distribution in ("truncated_normal", "normal"):  # TF1 reads "normal" as truncated
        # The stddev of a unit normal truncated to 2 sigma (Keras' constant), so the rows'
        # variance is ``variance``.
        return core_inits.truncated_normal(0.0, float(np.sqrt(variance)) / .87962566103423978,
                                           seed)
    raise TypeError(f"VarianceScaling distribution {distribution!r} is not supported")


def _call_as_tfra(initializer):
    """What TFRA's ``_convert_anything_to_init`` does with a callable: ``init(shape=[1])``, or
    ``init()`` if that raises."""
    try:
        value = initializer(shape=[1])
    except Exception:  # noqa: BLE001 -- TFRA's rule: any failure means "call it without a shape"
        value = initializer()
    if value is None:  # a function without a return: never "zeros" by accident
        raise TypeError(f"callable initializer {initializer!r} returned None")
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if not hasattr(value, "numpy"):
            raise TypeError("a callable initializer must return a concrete value when called "
                            "eagerly (it is called once, when the Variable is made)")
        value = value.numpy()
    return value
