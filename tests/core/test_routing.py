"""One routing function (dualemb.core.routing.shard_of) gives the same shard for a key in numpy,
TensorFlow and JAX, and is the default of every part that routes keys."""

import numpy as np
import pytest

from dualemb.core.routing import shard_of

KEYS = np.array([0, 1, 2, 3, 7, -1, -2, -7, 2**40 + 3, -(2**40) - 3, 2**62, -(2**63)], np.int64)


def reference(keys, n):
    # Floored modulo by hand: Python ints, not any array library.
    return np.array([int(k) - n * (int(k) // n) for k in keys], np.int64)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_numpy_matches_floored_mod(n):
    got = shard_of(KEYS, n)
    np.testing.assert_array_equal(got, reference(KEYS, n))
    assert got.min() >= 0 and got.max() < n


@pytest.mark.parametrize("n", [2, 3, 5])
def test_tensorflow_and_jax_route_like_numpy(n):
    tf = pytest.importorskip("tensorflow")
    np.testing.assert_array_equal(shard_of(tf.constant(KEYS), n).numpy(), reference(KEYS, n))
    np.testing.assert_array_equal(shard_of(tf.constant(KEYS[:8].astype(np.int32)), n).numpy(),
                                  reference(KEYS[:8], n))
    jnp = pytest.importorskip("jax.numpy")
    k32 = KEYS[:8].astype(np.int32)  # jax's default 32-bit mode
    np.testing.assert_array_equal(np.asarray(shard_of(jnp.asarray(k32), n)), reference(k32, n))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_shard_count(bad):
    with pytest.raises(ValueError, match="num_shards"):
        shard_of(KEYS, bad)


def test_every_default_partitioner_is_the_routing_function():
    tf = pytest.importorskip("tensorflow")
    from dualemb.core.checkpoint import _load
    from dualemb.tf import migrate
    from dualemb.tf.variable import default_partition_fn
    for n in (1, 3):
        want = reference(KEYS, n)
        np.testing.assert_array_equal(default_partition_fn(tf.constant(KEYS), n).numpy(), want)
        np.testing.assert_array_equal(migrate.default_partition(KEYS, n), want)
        np.testing.assert_array_equal(_load._default_partitioner(KEYS, n), want)
