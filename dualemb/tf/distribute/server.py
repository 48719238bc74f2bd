"""A TensorFlow server task (PS or worker) that can run dualemb's table ops.

    python -m dualemb.tf.server --job ps --task 0 \
        --cluster '{"worker": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}'

A task runs the ops the chief places on it; TensorFlow resolves an op by name in the process that
runs it, so every PS and worker process must have loaded dualemb's op library (``import
dualemb.tf``) before it serves, or the ops fail there as "Op type not registered". This module
does exactly that, then serves until killed (``tf.distribute.Server(...).join()``).
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dualemb.tf.server",
                                description="Serve one task of a TensorFlow cluster with "
                                            "dualemb's ops loaded.")
    p.add_argument("--job", required=True, help="job name: ps, worker, ...")
    p.add_argument("--task", type=int, required=True, help="task index within the job")
    p.add_argument("--cluster", required=True,
                   help='cluster spec as JSON: {"worker": ["host:port", ...], "ps": [...]}')
    p.add_argument("--protocol", default="grpc")
    return p.parse_args(argv)


def serve(job: str, task: int, cluster: dict, protocol: str = "grpc") -> None:
    import tensorflow as tf

    import dualemb.tf  # noqa: F401  (registers the ops in this process)

    if job not in cluster:
        raise ValueError(f"job {job!r} is not in the cluster spec (jobs: {sorted(cluster)})")
    if not 0 <= task < len(cluster[job]):
        raise ValueError(f"task {task} out of range for job {job!r} ({len(cluster[job])} tasks)")
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=task,
                                  protocol=protocol, start=True)
    print(f"dualemb.tf.server: {job}:{task} serving at {server.target}", flush=True)
    server.join()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cluster = json.loads(args.cluster)
    except json.JSONDecodeError as e:
        print(f"--cluster is not valid JSON: {e}", file=sys.stderr)
        return 2
    serve(args.job, args.task, cluster, args.protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
