"""The server of tests/tf/test_tf_serving_fresh_process.py: a fresh Python process that loads an
exported SavedModel (its own tables), follows a checkpoint directory with ``de.saving.follow``
while it serves, and answers the test's requests on stdin.

    python tests/tf/serving_process.py MODEL_DIR CKPT_DIR KEYS.npy OUT_DIR

It imports TensorFlow and dualemb first (the slow part, overlapping the trainer's setup) and
waits for a first line ``load`` on stdin (the SavedModel and the first checkpoint exist then);
it prints ``ready`` once the follower polls. Each further request line is a step: once the tables hold the
checkpoint of that step (the follower's last applied one), the model's ``lookup`` signature is
run on the keys, its rows written to ``OUT_DIR/rows-<step>.npy`` and ``rows <step>`` printed.
``quit`` (or the end of stdin) stops it. A follower error or a step not reached within
``WAIT_S`` prints ``error <message>`` and exits with status 2.
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import dualemb.tf as de  # registers dualemb's ops before the SavedModel is loaded

WAIT_S = 60.0  # safety bound for one request: the test publishes before it asks


def wait_for_step(follower, step: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (follower.applied and follower.applied[-1].steps.get("emb") == step):
        if follower.error is not None:
            raise RuntimeError(f"the follower failed: {follower.error}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not applied within {WAIT_S} s (applied: "
                               f"{[a.steps for a in follower.applied]})")
        time.sleep(0.005)


def main() -> int:
    model_dir, ckpt_dir, keys_path, out_dir = sys.argv[1:5]
    if sys.stdin.readline().strip() != "load":
        return 0  # the test ended before it exported the model
    keys = tf.constant(np.load(keys_path))
    served = tf.saved_model.load(model_dir)
    follower = de.saving.follow(ckpt_dir, {"emb": served.var}).start(interval=0.01)
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            request = line.strip()
            if request == "quit":
                break
            step = int(request)
            wait_for_step(follower, step)
            rows = served.lookup(keys).numpy()
            path = os.path.join(out_dir, f"rows-{step}.npy")
            np.save(path + ".tmp.npy", rows)
            os.replace(path + ".tmp.npy", path)  # the test reads only complete files
            print(f"rows {step}", flush=True)
    except (RuntimeError, TimeoutError) as e:
        print(f"error {e}", flush=True)
        return 2
    finally:
        follower.stop(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
