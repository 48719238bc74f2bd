"""Allocation failures leave a table exactly as it was (issue 9, item 1).

Every grow path allocates before it changes anything: the hash index rehash, the row chunks,
reserve, set_optimizer's slot columns, and the room a batched write needs for its new keys. The
checks run in a child process whose address space is capped with RLIMIT_AS, so allocations fail
for real (and a crash of the old code fails the test instead of killing pytest).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dualemb.core import Table

CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from dualemb.core import Table

    DIM = 16
    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, 300_000, replace=False).astype(np.int64)
    vals = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    t = Table(DIM)
    t.insert_or_assign(keys, vals)

    order = np.argsort(keys)
    sorted_keys, sorted_vals = keys[order], vals[order]

    def check(what):
        # In small pieces, so the check itself fits under the memory cap set below.
        for i in range(0, len(keys), 10_000):
            got, exists = t.find(keys[i:i + 10_000])
            assert exists.all(), what
            np.testing.assert_array_equal(got, vals[i:i + 10_000], err_msg=what)
        assert t.size() == len(keys), (what, t.size())
        seen = 0
        for page in t.export_pages(10_000):
            pos = np.searchsorted(sorted_keys, page["keys"])
            assert (sorted_keys[np.minimum(pos, len(keys) - 1)] == page["keys"]).all(), what
            np.testing.assert_array_equal(page["values"], sorted_vals[pos], err_msg=what)
            seen += len(page["keys"])
        assert seen == len(keys), (what, seen)
        print("ok", what, flush=True)

    # Absurd sizes are refused up front, naming the size.
    for n in (10**12, 10**15, 2**62):
        try:
            t.reserve(n)
            raise SystemExit(f"reserve({n}) did not fail")
        except (MemoryError, ValueError) as e:
            message = str(e)
        check(f"reserve({n})")  # before the message: the old code crashed here
        assert str(n) in message, message

    # Inputs of the failing calls are built before the cap.
    new_keys = np.arange(1, 3_000_001, dtype=np.int64) + (1 << 41)
    new_vals = np.ones((len(new_keys), DIM), np.float32)
    t.find(keys)  # starts the thread pool before the cap
    used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + (48 << 20), resource.RLIM_INFINITY))

    def must_fail(what, fn):
        try:
            fn()
        except MemoryError as e:
            print("MemoryError", what, str(e)[:120], flush=True)
        else:
            raise SystemExit(f"{what} did not run out of memory")
        check(what)

    must_fail("reserve(30M)", lambda: t.reserve(30_000_000))
    must_fail("set_optimizer", lambda: t.set_optimizer({"name": "adam"}))
    assert t.optimizer is None and t.num_slots == 0
    must_fail("insert_or_assign", lambda: t.insert_or_assign(new_keys, new_vals))
    must_fail("accum", lambda: t.accum(new_keys, new_vals, np.zeros(len(new_keys), bool)))
    must_fail("import_rows", lambda: t.import_rows(new_keys, new_vals))
    print("all done", flush=True)
""")

CHILD_GRADIENTS = textwrap.dedent("""
    import resource
    import numpy as np
    from dualemb.core import Table

    # Adam's two slots make a row (216 bytes) much larger than its output or gradient (64
    # bytes), so the core's allocations fail while the numpy buffers still fit under the cap.
    DIM = 16
    keys = np.arange(200_000, dtype=np.int64)
    t = Table(DIM, optimizer={"name": "adam"})
    t.apply_gradients(keys, np.ones((len(keys), DIM), np.float32), 0.5, 1)
    before = t.export()
    new_keys = (np.arange(1, 600_001, dtype=np.int64) << 20)
    step_keys = np.concatenate([keys[:1000], new_keys, keys[:1000]])
    grads = np.ones((len(step_keys), DIM), np.float32)
    t.find(keys)
    for what, fn in [("apply_gradients", lambda: t.apply_gradients(step_keys, grads, 0.5, 2)),
                     ("find_or_insert", lambda: t.find_or_insert(new_keys))]:
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (80 << 20), resource.RLIM_INFINITY))
        try:
            fn()
            raise SystemExit(f"{what} did not run out of memory")
        except MemoryError as e:
            print("MemoryError", what, str(e)[:120])
        finally:  # the soft limit may be raised again up to the hard one (unlimited)
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        after = t.export()
        for name in ("keys", "values", "slots", "last_update", "update_count"):
            np.testing.assert_array_equal(after[name], before[name], err_msg=f"{what}: {name}")
        del after
    print("all done", flush=True)
""")


def _run(code):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_failed_allocations_leave_the_table_unchanged():
    run = _run(CHILD)
    report = f"rc={run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.returncode == 0 and "all done" in run.stdout, report


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_failed_apply_gradients_leaves_rows_and_slots_unchanged():
    run = _run(CHILD_GRADIENTS)
    report = f"rc={run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.returncode == 0 and "all done" in run.stdout, report


def test_reserve_refuses_absurd_sizes_in_process():
    t = Table(4)
    t.insert_or_assign(np.arange(50), np.arange(200, dtype=np.float32).reshape(50, 4))
    with pytest.raises(MemoryError, match="reserve\\(1000000000000\\) needs .* bytes"):
        t.reserve(10**12)
    with pytest.raises(ValueError):
        t.reserve(-1)
    got, exists = t.find(np.arange(50))
    assert exists.all() and t.size() == 50
    np.testing.assert_array_equal(got, np.arange(200, dtype=np.float32).reshape(50, 4))
