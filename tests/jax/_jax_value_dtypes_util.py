"""The value-dtype scenario of dualemb.jax, shared by tests/jax/test_jax_value_dtypes.py (in process,
FFI) and its subprocesses (the host-callback path): every non-training operation under jit on
one table, checked against a dict of numpy rows after each step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import dualemb.jax as dej

DIM = 3
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
         "float64": np.float64, "int8": np.int8, "int32": np.int32, "int64": np.int64}
INITIAL = {"float": 0.5, "int": 3}  # exactly representable in every dtype of the kind


def is_int(vd: str) -> bool:
    return vd.startswith("int")


def initializer(vd: str) -> dict:
    return {"initializer": "constant", "value": INITIAL["int" if is_int(vd) else "float"]}


def init_row(vd: str) -> np.ndarray:
    return np.full(DIM, INITIAL["int" if is_int(vd) else "float"], NUMPY[vd])


def random_rows(vd: str, n: int, rs: np.random.RandomState) -> np.ndarray:
    if is_int(vd):
        return rs.randint(-60, 60, size=(n, DIM)).astype(NUMPY[vd])
    return (rs.standard_normal((n, DIM)) * 4).astype(NUMPY[vd])


def add(vd: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The core's accum arithmetic: half precision adds in float32 and rounds; the others add
    in their own dtype (integers wrap)."""
    if vd in ("float16", "bfloat16"):
        return (a.astype(np.float32) + b.astype(np.float32)).astype(NUMPY[vd])
    return (a + b).astype(NUMPY[vd])


def key_ids(values, key_dtype: str):
    a = np.asarray(values, np.int64 if key_dtype == "int64" else np.int32)
    return jnp.asarray(a)


def check_rows(got, want_rows: list, vd: str, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == np.dtype(NUMPY[vd]), (what, got.dtype, vd)
    want = np.stack(want_rows).astype(NUMPY[vd])
    assert got.tobytes() == want.tobytes(), (what, got, want)


def exported(table) -> dict:
    keys, values, count = jax.jit(lambda t: dej.export(t, 32))(table)
    n = int(count)
    keys = np.asarray(keys)[:n]
    values = np.asarray(values)
    assert values.dtype == np.dtype(table.dtype)
    return {int(k): values[i] for i, k in enumerate(keys)}


def check_state(table, ref: dict, vd: str, what: str) -> None:
    got = exported(table)
    assert sorted(got) == sorted(ref), (what, sorted(got), sorted(ref))
    for k in ref:
        assert got[k].tobytes() == ref[k].tobytes(), (what, k, got[k], ref[k])
    assert int(jax.jit(dej.size)(table)) == len(ref)


def run(vd: str, key_dtype: str = "int32", seed: int = 0) -> None:
    """Every non-training operation, jitted, on a ``vd`` table against a dict reference."""
    rs = np.random.RandomState(seed)
    table = dej.create(DIM, key_dtype=key_dtype, value_dtype=vd, initializer=initializer(vd))
    assert table.dtype == np.dtype(NUMPY[vd]) and table.value_dtype == vd
    ref: dict = {}
    try:
        # insert (the last of duplicate ids wins)
        ids = [3, 7, 11, 7]
        rows = random_rows(vd, 4, rs)
        table = jax.jit(dej.insert)(table, key_ids(ids, key_dtype), jnp.asarray(rows))
        for k, r in zip(ids, rows):
            ref[k] = r
        check_state(table, ref, vd, "insert")

        # lookup / find: present ids read their rows, missing ones the initializer row
        q = [3, 7, 11, 99]
        want = [ref.get(k, init_row(vd)) for k in q]
        check_rows(jax.jit(dej.lookup)(table, key_ids(q, key_dtype)), want, vd, "lookup")
        rows_f, exists = jax.jit(dej.find)(table, key_ids(q, key_dtype))
        check_rows(rows_f, want, vd, "find")
        assert np.asarray(exists).tolist() == [True, True, True, False]

        # find_or_insert inserts 99 with its initializer row
        rows_fi, exists_fi, table = jax.jit(dej.find_or_insert)(table, key_ids([99, 3],
                                                                               key_dtype))
        check_rows(rows_fi, [init_row(vd), ref[3]], vd, "find_or_insert")
        assert np.asarray(exists_fi).tolist() == [False, True]
        ref[99] = init_row(vd)
        check_state(table, ref, vd, "find_or_insert")

        # accum (TFRA's rule): 3 present & exists -> add; 11 present & !exists -> ignored;
        # 50 absent & !exists -> inserted; 51 absent & exists -> ignored
        deltas = random_rows(vd, 4, rs)
        flags = jnp.asarray([True, False, False, True])
        table = jax.jit(dej.accum)(table, key_ids([3, 11, 50, 51], key_dtype),
                                   jnp.asarray(deltas), flags)
        ref[3] = add(vd, ref[3], deltas[0])
        ref[50] = deltas[2]
        check_state(table, ref, vd, "accum")

        # erase (absent ids ignored)
        table = jax.jit(dej.erase)(table, key_ids([7, 1000], key_dtype))
        del ref[7]
        check_state(table, ref, vd, "erase")
    finally:
        dej.destroy(table)
