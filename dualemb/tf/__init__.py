"""``dualemb.tf``: TFRA's ``dynamic_embedding`` API on TensorFlow 2.21 and Keras 3.

    import dualemb.tf as de     # in place of: from tensorflow_recommenders_addons import
                                #              dynamic_embedding as de

Same names, arguments and defaults as ``tfra.dynamic_embedding``; tables live in the shared C++
core (one process-wide registry, also reachable from ``dualemb.core`` and ``dualemb.jax``).
Importing this package patches nothing in TensorFlow or Keras: it loads the op library (checking
the TensorFlow version it was built for) and registers the wrapped optimizer classes with Keras'
serialization registry. See docs/tf.md.
"""

from dualemb.tf import ops  # loads dualemb/tf/_ops.so first (TF version check)
from dualemb.tf import data_flow, keras, math, ragged_embedding_ops, saving, shadow_ops, train
from dualemb.tf.saving.common_format import load, save
from dualemb.tf.creators import (CuckooHashTableConfig, CuckooHashTableCreator, FileSystemSaver,
                                 HkvEvictStrategy, HkvHashTableConfig, HkvHashTableCreator,
                                 KVCreator, RedisTableConfig, RedisTableCreator)
from dualemb.tf.lookup import (embedding_lookup, embedding_lookup_sparse,
                               embedding_lookup_unique, safe_embedding_lookup_sparse)
from dualemb.tf.lookup_many import embedding_lookup_many
from dualemb.tf.modes import (ModelMode, enable_inference_mode, enable_train_mode,
                              get_model_mode)
from dualemb.tf.optimizers import DynamicEmbeddingOptimizer, DynamicEmbeddingOptimizerWrapper
from dualemb.tf.policies import (FrequencyRestrictPolicy, RestrictPolicy,
                                 TimestampRestrictPolicy)
from dualemb.tf.slots import SlotVariable
from dualemb.tf.trainable import TrainableWrapper, trainable_wrapper_filter
from dualemb.tf.variable import GraphKeys, Variable, default_partition_fn, get_variable

__all__ = [
    "Variable", "get_variable", "default_partition_fn", "TrainableWrapper", "SlotVariable",
    "embedding_lookup", "embedding_lookup_unique", "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse", "embedding_lookup_many", "DynamicEmbeddingOptimizer",
    "DynamicEmbeddingOptimizerWrapper", "RestrictPolicy",
    "TimestampRestrictPolicy", "FrequencyRestrictPolicy", "ModelMode", "enable_train_mode",
    "enable_inference_mode", "get_model_mode", "KVCreator", "CuckooHashTableConfig",
    "CuckooHashTableCreator", "HkvHashTableConfig", "HkvHashTableCreator", "HkvEvictStrategy",
    "RedisTableConfig", "RedisTableCreator", "FileSystemSaver", "GraphKeys",
    "trainable_wrapper_filter", "keras", "ops", "math", "data_flow", "ragged_embedding_ops",
    "shadow_ops", "train", "save", "load", "saving",
]

