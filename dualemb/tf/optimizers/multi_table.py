"""The multi-table switch of the optimizer step, under its earlier path: the step itself, with the
grouping rule, is ``row_update.py``."""

from dualemb.tf.optimizers.row_update import ENV_SWITCH, enabled, fused_steps

__all__ = ["ENV_SWITCH", "enabled", "fused_steps"]
