"""A helper of the TF tests: steps of a DynamicEmbeddingOptimizer on ``sum(lookup(ids))``, whose
gradient is 1 for every occurrence of an id (simple to reason about in the expected rows)."""

import tensorflow as tf

import dualemb.tf as de


def train_sum_loss(var, batches, optimizer):
    """One step per batch of ids on ``var`` (an embedding_lookup named "t"); returns the
    DynamicEmbeddingOptimizer wrapping ``optimizer``."""
    opt = de.DynamicEmbeddingOptimizer(optimizer)
    for ids in batches:
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(var, tf.constant(ids, tf.int64), name="t",
                                                 return_trainable=True)
            loss = tf.reduce_sum(emb)
        opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
    return opt
