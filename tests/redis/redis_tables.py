"""What the Redis tests share: a Redis-backed Table on given servers with short timeouts, its
rows in key order, and the comparison with the in-memory table (the reference) after the same
random operations."""

import itertools

import numpy as np

from dualemb.core import Table
from redis_server import RedisServer

TIMEOUT_MS = 500
_names = itertools.count()


def redis_table(server_or_addresses, dim=4, name=None, mode=None, **kwargs):
    """A Table stored on ``server_or_addresses`` (a RedisServer or a list of "host:port"), under
    a fresh name unless one is given; ``redis=`` adds backend options."""
    addresses = ([server_or_addresses.address] if isinstance(server_or_addresses, RedisServer)
                 else list(server_or_addresses))
    cfg = {"name": name or f"t{next(_names)}", "addresses": addresses,
           "connect_timeout_ms": TIMEOUT_MS, "command_timeout_ms": TIMEOUT_MS,
           **({"mode": mode} if mode else {}), **kwargs.pop("redis", {})}
    return Table(dim=dim, backend={"redis": cfg}, **kwargs)


def fresh_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def rows(table) -> dict:
    """The table's export, sorted by key."""
    out = table.export()
    order = np.argsort(out["keys"], kind="stable")
    return {k: v[order] for k, v in out.items()}


def assert_same_rows(a, b):
    """Two tables (or ``rows`` of them) hold the same keys, values, slots and update counts."""
    ra, rb = (a if isinstance(a, dict) else rows(a)), (b if isinstance(b, dict) else rows(b))
    for k in ("keys", "values", "slots", "update_count"):
        np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)


def random_ops_alike(red, mem, steps, span, max_batch, erase, with_restrict=False):
    """The same random batch operations (duplicates on purpose) on ``red`` and ``mem``; after
    each, the rows they find (and whether they exist) must agree to the bit. With
    ``with_restrict``, a frequency restrict from step 21 and a clear at step 41 join in."""
    rng = np.random.default_rng(1)
    kinds = 7 if with_restrict else 6
    for step in range(1, steps + 1):
        keys = rng.integers(-span, span, size=int(rng.integers(0, max_batch)))
        vals = rng.normal(size=(keys.size, red.dim)).astype(np.float32)
        op = step % kinds
        if op == 0:
            red.insert_or_assign(keys, vals), mem.insert_or_assign(keys, vals)
        elif op == 1:
            a, b = red.find_or_insert(keys), mem.find_or_insert(keys)
            np.testing.assert_array_equal(a[0], b[0]), np.testing.assert_array_equal(a[1], b[1])
        elif op == 2:
            ex = rng.integers(0, 2, keys.size).astype(bool)
            red.accum(keys, vals, ex), mem.accum(keys, vals, ex)
        elif op == 3:
            red.apply_gradients(keys, vals, lr=0.01, step=step)
            mem.apply_gradients(keys, vals, lr=0.01, step=step)
        elif op == 4:
            red.erase(keys[:erase]), mem.erase(keys[:erase])
        elif op == 5 and with_restrict and step > 20:
            assert red.restrict(30, by="frequency") == mem.restrict(30, by="frequency")
        elif op == 6 and step == 41:
            red.clear(), mem.clear()
        a, b = red.find(keys), mem.find(keys)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert red.size() == mem.size()
