"""The framework-neutral core: ``Table`` (numpy in and out), initializer and optimizer specs,
and the common checkpoint format."""

from dualemb.core import initializers, optimizers
from dualemb.core.table import Table

__all__ = ["Table", "initializers", "optimizers"]
