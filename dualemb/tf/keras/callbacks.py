"""``de.keras.callbacks``: Keras 3 callbacks of dualemb."""

from __future__ import annotations

import keras

__all__ = ["CommonFormatCheckpoint"]


class CommonFormatCheckpoint(keras.callbacks.Callback):
    """Saves the model's dynamic-embedding tables (optimizer slots included), its dense weights
    and its optimizer's variables with ``de.save`` during ``fit``, in the common checkpoint format
    (docs/checkpoint_format.md) that ``de.load`` and ``dualemb.jax`` read.

    Args:
      path: the checkpoint directory; may hold ``{epoch}`` and ``{step}`` (1-based counts of
        this fit), e.g. ``"ckpt/step-{step}"``; without them each save replaces the last,
        atomically.
      save_freq: ``"epoch"`` (at the end of every epoch) or an integer N (every N batches).
      blocking: False saves in the background (``de.save(..., blocking=False)``): the state as
        of the end of the batch or epoch is copied and written while training goes on; a save
        waits for the one before it, an error of a background save is raised by the next save
        or at the end of training (``on_train_end`` waits for the last save). True (the
        default) writes each checkpoint before training continues.
      include_dense, metadata: as in ``de.save``.
    """

    def __init__(self, path, save_freq="epoch", blocking: bool = True, include_dense=True,
                 metadata=None):
        super().__init__()
        if save_freq != "epoch" and (isinstance(save_freq, bool) or
                                     not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"save_freq must be 'epoch' or a positive integer, got "
                             f"{save_freq!r}")
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True or False, got {blocking!r}")
        self.path = str(path)
        self.save_freq = save_freq
        self.blocking = blocking
        self.include_dense = include_dense
        self.metadata = metadata
        self.handle = None  # the last background save (a dualemb.core.checkpoint.SaveHandle)
        self._epoch = 0
        self._step = 0

    def _save(self):
        from dualemb.tf.saving import common_format  # imports dualemb.tf: not at module import
        path = self.path.format(epoch=self._epoch, step=self._step)
        out = common_format.save(self.model, path, include_dense=self.include_dense,
                                 metadata=self.metadata, blocking=self.blocking)
        if not self.blocking:
            self.handle = out

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self.save_freq != "epoch" and self._step % self.save_freq == 0:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save()

    def on_train_end(self, logs=None):
        if self.handle is not None:
            self.handle.wait()  # raises the last background save's error
