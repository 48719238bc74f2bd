"""What every test shares: the layer folders' markers, quiet TensorFlow logs, and tests/ on
sys.path (so `_paths`, `redis_server` and each folder's helpers import by name).

Run one layer: `python -m pytest -q tests/core` (about 20 s), `tests/checkpoint`, `tests/jax`,
`tests/tf`, `tests/tf/distribute`, `tests/redis`, `tests/interop`. Or select by marker:
`-m "not slow"` (the quick suite), `-m redis`, `-m multiprocess`, `-m sanitizer`, `-m gpu`.
The whole suite runs in two worker processes (pytest-xdist; the README's command); every test
keeps to its own temporary directory, free ports and processes, so two files can run at once.
"""

import os

# Before any test module imports TensorFlow (they used to set this each, 25 times).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARKERS = {
    "slow": "takes more than about 20 s (multi-process clusters, sanitizer builds, the demo)",
    "multiprocess": "starts other processes (TF clusters, jax.distributed, workers) on 127.0.0.1",
    "redis": "needs redis-server (skipped, naming the Debian package, where it is missing)",
    "sanitizer": "builds and runs the core under ASan/UBSan",
    "gpu": "needs a CUDA GPU (skipped, naming why, where there is none)",
}

# Marked by where a test lives or what its file is, so a new test in a folder is marked
# without remembering to: (path fragment, markers).
_BY_PATH = (
    ("tests/redis/", ("redis",)),
    ("tests/tf/distribute/", ("multiprocess", "slow")),
    ("tests/core/test_sanitizers.py", ("sanitizer", "slow")),
    ("tests/interop/test_demo.py", ("multiprocess", "slow")),
    ("tests/jax/test_jax_multiprocess.py", ("multiprocess", "slow")),
    ("tests/checkpoint/test_checkpoint_object_store.py", ("multiprocess",)),
    ("tests/jax/test_jax_sharded_checkpoint.py", ("multiprocess",)),
    ("tests/jax/test_jax_host_callback.py", ("multiprocess",)),
    ("tests/jax/test_jax_nnx_sharded.py", ("multiprocess",)),
    ("tests/jax/test_jax_sharded.py", ("multiprocess",)),
    ("/test_gpu_", ("gpu",)),
)


def pytest_configure(config):
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        path = str(item.path).replace(os.sep, "/")
        for fragment, names in _BY_PATH:
            if fragment in path:
                for name in names:
                    item.add_marker(getattr(pytest.mark, name))
        # A backend-parametrised core test that runs against Redis needs the server too.
        if "redis" in item.nodeid.split("::", 1)[-1].lower():
            item.add_marker(pytest.mark.redis)
    # The slow files first (a stable sort: the order within each group stays): under
    # `-n 2 --dist loadfile --no-loadscope-reorder` (the README's command) each worker takes the
    # next file in this order, so the minutes-long files (the sanitizer build, the clusters)
    # start at once and the many short files fill the gaps, instead of one long file ending the
    # run alone.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
