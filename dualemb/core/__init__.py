"""The framework-neutral core: ``Table`` (numpy in and out), initializer and optimizer specs,
and the common checkpoint format."""

from dualemb.core import initializers, optimizers
from dualemb.core.table import Table, apply_gradients_many, find_many, find_or_insert_many

__all__ = ["Table", "initializers", "optimizers", "find_many", "find_or_insert_many",
           "apply_gradients_many"]
