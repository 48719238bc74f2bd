"""dualemb: dynamic embedding tables for recommender models.

One C++ table core (``dualemb.core``) behind two front ends: ``dualemb.tf`` (a drop-in for
``tfra.dynamic_embedding`` on TensorFlow 2.21 / Keras 3) and ``dualemb.jax`` (a functional API
over XLA FFI). Both read and write one checkpoint format.
"""

__version__ = "0.1.0"
