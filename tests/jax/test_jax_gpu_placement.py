"""dualemb.jax.create(placement=...) where no GPU table can be made (this machine): clear
errors, and the GPU handle's static placement. The GPU tables themselves: tests/gpu."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import dualemb.jax as dej
from dualemb.jax import gpu as dej_gpu


def test_placement_is_checked_before_anything_is_made():
    with pytest.raises(ValueError, match="placement must be 'host' or 'gpu'"):
        dej.create(4, placement="tpu")
    with pytest.raises(ValueError, match="key_dtype='int64' and value_dtype='float32'"):
        dej.create(4, key_dtype="int32", placement="gpu")
    with pytest.raises(ValueError, match="generic Optax path is host-only"):
        import optax
        dej.create(4, optimizer=optax.sgd(0.1), placement="gpu")


@pytest.mark.skipif(dej_gpu.available()[0], reason="a GPU table can be made here")
def test_gpu_placement_without_a_gpu_names_why():
    ok, why = dej_gpu.available()
    assert not ok and why
    with pytest.raises(RuntimeError, match="no GPU table can be made here: " + why[:20]):
        dej.create(4, optimizer=dej.optimizers.adam(0.1), placement="gpu")


def test_placement_is_static_and_kept_by_the_pytree():
    host = dej.create(4)
    try:
        gpu = host.replace()
        gpu.placement = "gpu"  # a GPU handle's shape, without a GPU table behind it
        assert jax.tree_util.tree_structure(host) != jax.tree_util.tree_structure(gpu)
        leaves, treedef = jax.tree_util.tree_flatten(gpu)
        again = jax.tree_util.tree_unflatten(treedef, leaves)
        assert again.placement == "gpu" and host.replace(version=1).placement == "host"
        assert "placement='gpu'" in repr(gpu)
        # Ops without a CUDA handler refuse a GPU table, naming it, before anything runs.
        with pytest.raises(NotImplementedError, match="not available on a GPU table"):
            dej.insert(gpu, jnp.array([1]), jnp.zeros((1, 4)))
        with pytest.raises(NotImplementedError, match="not available on a GPU table"):
            dej.erase(gpu, jnp.array([1]))
        # ... and a GPU handle is looked up in the GPU registry, not the core's.
        with pytest.raises(KeyError, match="unknown GPU table id"):
            dej.lookup(gpu, jnp.array([1]))
    finally:
        dej.destroy(host)
