"""Reproduces a TensorFlow 2.21 crash that dualemb works around (dualemb/tf/trainable.py): under
MultiWorkerMirroredStrategy with 2 workers, creating a zero-size variable whose initial value is a
numpy array segfaults the chief in CollectiveBcastSend; the same variable from ``tf.zeros``
is created fine. Run one process per worker with TF_CONFIG set:

    TF_CONFIG='{"cluster":{"worker":["127.0.0.1:P0","127.0.0.1:P1"]},
                "task":{"type":"worker","index":I}}' python zero_size_broadcast.py numpy|tf

``numpy``: worker 0 exits with SIGSEGV (rc -11 / 139), worker 1 then fails to connect;
``tf``: both print "created (0, 4)".
"""

import sys

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    initial = np.zeros((0, 4), np.float32) if sys.argv[1] == "numpy" else tf.zeros((0, 4))
    v = tf.Variable(initial)
print("created", v.shape, flush=True)
