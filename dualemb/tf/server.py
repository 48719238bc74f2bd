"""``python -m dualemb.tf.server --job ps --task 0 --cluster '<json>'``: a PS or worker task with
dualemb's ops loaded (see ``dualemb/tf/distribute/server.py``)."""

import sys

from dualemb.tf.distribute.server import main

if __name__ == "__main__":
    sys.exit(main())
