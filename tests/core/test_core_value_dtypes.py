"""Value dtypes of the core table (float32, float16, bfloat16, float64, int8, int32, int64):
every (key dtype, value dtype) pair TFRA's CPU tables accept, checked operation by operation
against a dict / numpy reference with exact values; float16/bfloat16 conversion and training
against numpy's and ml_dtypes' rounding of the same float32 math; refusals leave the table
unchanged."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from dualemb.core import Table, checkpoint, initializers
from dualemb.core.checkpoint import CheckpointError

BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16,
      "float64": np.dtype(np.float64), "int8": np.dtype(np.int8), "int32": np.dtype(np.int32),
      "int64": np.dtype(np.int64)}
# TFRA's CPU tables: int64 keys with these values, int32 keys with these.
PAIRS = ([("int64", v) for v in ("float32", "float16", "bfloat16", "float64", "int32", "int8",
                                 "int64")] +
         [("int32", v) for v in ("float32", "int32", "float64", "bfloat16")])
DIM = 5


def random_rows(vd, n, rng):
    """Rows spanning the dtype: the full integer range (int64 beyond 2^53, so a double
    round trip would show), or floats of mixed magnitudes."""
    dt = NP[vd]
    if dt.kind == "i":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, (n, DIM), dtype=dt, endpoint=True)
    x = rng.normal(size=(n, DIM)) * 10.0 ** rng.integers(-3, 3, (n, DIM))
    return x.astype(dt)


def accum_reference(row, delta, vd):
    """The core's accum arithmetic: integers wrap (numpy's integer add wraps too), float16 and
    bfloat16 add in float32 and round, float32/float64 in their own precision."""
    dt = NP[vd]
    if dt.kind == "i":
        with np.errstate(over="ignore"):
            return (row + delta).astype(dt)
    if vd in ("float16", "bfloat16"):
        return (row.astype(np.float32) + delta.astype(np.float32)).astype(dt)
    return (row + delta).astype(dt)


def same_bits(a, b):
    """Exact equality, NaN equal to NaN (bit patterns of NaN payloads may differ)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.kind == "i":
        return np.array_equal(a, b)
    with np.errstate(invalid="ignore"):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(fa) & np.isnan(fb)
    return bool(np.all(both_nan | ((fa == fb) & (np.signbit(fa) == np.signbit(fb)))))


def table_dict(t):
    page = t.export()
    return {int(k): v for k, v in zip(page["keys"], page["values"])}


def assert_table_equals(t, ref):
    got = table_dict(t)
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].dtype == t.value_dtype
        assert same_bits(got[k], v), (k, got[k], v)


@pytest.mark.parametrize("key_dtype,value_dtype", PAIRS)
def test_dtype_matrix_operations(key_dtype, value_dtype):
    rng = np.random.default_rng(hash((key_dtype, value_dtype)) % 2**32)
    dt = NP[value_dtype]
    init_value = 3 if dt.kind == "i" else 0.5
    t = Table(dim=DIM, key_dtype=key_dtype, value_dtype=value_dtype, initializer=init_value)
    assert t.value_dtype == dt
    assert t.describe()[0]["value_dtype"] == value_dtype
    init_row = np.full(DIM, init_value, dt)
    ref = {}

    keys = rng.choice(10_000, 200, replace=False).astype(key_dtype)
    rows = random_rows(value_dtype, 200, rng)
    t.insert_or_assign(keys, rows)
    ref.update({int(k): r for k, r in zip(keys, rows)})
    assert_table_equals(t, ref)

    # find: present rows exactly, missing rows read as the initializer row (not inserted).
    probe = np.concatenate([keys[:50], np.array([20_001, 20_002], key_dtype)])
    got, exists = t.find(probe)
    assert got.dtype == dt and list(exists) == [True] * 50 + [False, False]
    for k, g in zip(probe, got):
        assert same_bits(g, ref.get(int(k), init_row))
    assert t.size() == 200

    # find_or_insert inserts the initializer row.
    got, exists = t.find_or_insert(np.array([20_003], key_dtype))
    assert not exists[0] and same_bits(got[0], init_row)
    ref[20_003] = init_row.copy()

    # accum: present & exists -> add (wrap for ints); absent & !exists -> insert; else ignored.
    akeys = np.concatenate([keys[:40], np.array([30_001, 30_002], key_dtype), keys[40:42]])
    aexists = np.array([True] * 40 + [False, True] + [False, False])
    deltas = random_rows(value_dtype, len(akeys), rng)
    t.accum(akeys, deltas, aexists)
    for k, d, e in zip(akeys, deltas, aexists):
        k = int(k)
        if k in ref and e:
            ref[k] = accum_reference(ref[k], d, value_dtype)
        elif k not in ref and not e:
            ref[k] = d.copy()
    assert_table_equals(t, ref)

    # erase
    t.erase(keys[100:120])
    for k in keys[100:120]:
        ref.pop(int(k))
    assert_table_equals(t, ref)

    # export -> import into a fresh table of the same dtypes gives the same rows and metadata.
    page = t.export()
    assert page["values"].dtype == dt and page["slots"].dtype == dt
    u = Table(dim=DIM, key_dtype=key_dtype, value_dtype=value_dtype, initializer=init_value)
    u.import_rows(page["keys"], page["values"], last_update=page["last_update"],
                  update_count=page["update_count"])
    assert_table_equals(u, ref)

    # initial_values in the dtype
    assert same_bits(t.initial_values(np.array([7], key_dtype))[0], init_row)

    # restrict keeps the best by custom score, rows untouched
    order = sorted(ref)
    scores = np.arange(len(order), dtype=np.float32)
    removed = t.restrict(10, by="custom", keys=np.array(order, key_dtype), scores=scores)
    assert removed == len(order) - 10
    ref = {k: ref[k] for k in order[-10:]}
    assert_table_equals(t, ref)
    for x in (t, u):
        x.destroy()


@pytest.mark.parametrize("key_dtype,value_dtype", PAIRS)
def test_dtype_matrix_checkpoint_round_trip(tmp_path, key_dtype, value_dtype):
    rng = np.random.default_rng(7)
    dt = NP[value_dtype]
    t = Table(dim=DIM, key_dtype=key_dtype, value_dtype=value_dtype)
    keys = rng.choice(1 << 20, 300, replace=False).astype(key_dtype)
    rows = random_rows(value_dtype, 300, rng)
    t.insert_or_assign(keys, rows)
    ref = {int(k): r for k, r in zip(keys, rows)}
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"t": t})

    # The shard stores values in the dtype's own safetensors code, the manifest names it.
    manifest = json.load(open(tmp_path / "ck" / "manifest.json"))
    entry = manifest["tables"][0]
    assert entry["value_dtype"] == value_dtype
    with open(tmp_path / "ck" / entry["shards"][0]["file"], "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    code = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
            "int8": "I8", "int32": "I32", "int64": "I64"}[value_dtype]
    assert header["values"]["dtype"] == code

    # Into a new table (created from the manifest) and into a live one of the same dtypes.
    loaded = checkpoint.load(path).tables["t"]
    assert loaded.value_dtype == dt
    assert_table_equals(loaded, ref)
    live = Table(dim=DIM, key_dtype=key_dtype, value_dtype=value_dtype)
    checkpoint.load(path, {"t": live})
    assert_table_equals(live, ref)

    # A live table of another value dtype is refused, unchanged.
    other = "float32" if value_dtype != "float32" else "float64"
    wrong = Table(dim=DIM, key_dtype=key_dtype, value_dtype=other)
    wrong.insert_or_assign(np.array([1], key_dtype), np.ones((1, DIM), NP[other]))
    with pytest.raises(CheckpointError, match="value dtype mismatch"):
        checkpoint.load(path, {"t": wrong})
    assert_table_equals(wrong, {1: np.ones(DIM, NP[other])})
    for x in (t, loaded, live, wrong):
        x.destroy()


@pytest.mark.parametrize("value_dtype", ["float16", "bfloat16"])
def test_rounding_matches_numpy(value_dtype):
    """The core's float32 -> float16/bfloat16 rounding (used by initializers, accum and
    training) against numpy / ml_dtypes, on values chosen to hit every path: subnormals,
    ties, overflow to inf, the largest finite values, signed zeros."""
    dt = NP[value_dtype]
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    # Exact halfway points between neighbouring values of the target dtype, and its edges.
    grid = np.arange(0, 2**16, 7, dtype=np.uint16).view(dt).astype(np.float32)
    grid = grid[np.isfinite(grid)]
    halfway = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    edges = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e-8, -6e-8, 2.0**-25, 3e38,
                      1.1754944e-38, 5.96e-8], np.float32)
    values = np.concatenate([x[: 65536 - 3000 - len(edges)], halfway[:3000], edges])
    t = Table(dim=len(values), value_dtype=value_dtype,
              initializer=initializers.vector([float(v) for v in values]))
    got = t.initial_values([1])[0]
    with np.errstate(over="ignore"):
        want = values.astype(dt)
    assert same_bits(got, want)
    t.destroy()


@pytest.mark.parametrize("value_dtype", ["float16", "bfloat16"])
def test_accum_rounding_over_every_bit_pattern(value_dtype):
    """Every 16-bit pattern as a row, plus a delta: float32 add, rounded (widening included)."""
    dt = NP[value_dtype]
    rows = np.arange(2**16, dtype=np.uint16).view(dt).reshape(-1, 16)
    rng = np.random.default_rng(5)
    deltas = rng.permutation(np.arange(2**16, dtype=np.uint16)).view(dt).reshape(-1, 16)
    t = Table(dim=16, value_dtype=value_dtype)
    keys = np.arange(len(rows))
    t.insert_or_assign(keys, rows)
    assert same_bits(t.find(keys)[0], rows)  # byte-exact storage of every pattern
    t.accum(keys, deltas, np.ones(len(keys), bool))
    with np.errstate(over="ignore", invalid="ignore"):
        want = (rows.astype(np.float32) + deltas.astype(np.float32)).astype(dt)
    assert same_bits(t.find(keys)[0], want)
    t.destroy()


@pytest.mark.parametrize("value_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("optimizer", [{"name": "adam", "flavor": "keras"},
                                       {"name": "adagrad", "flavor": "keras"}])
def test_low_precision_training_is_float32_math_rounded(value_dtype, optimizer):
    """Each step equals the float32 table's step (the float32 kernel, itself checked against
    Keras elsewhere) started from the widened row and slots, rounded back to the dtype. Covers
    new keys (initializer row and initial slots rounded) and duplicate keys (summed)."""
    dt = NP[value_dtype]
    rng = np.random.default_rng(11)
    init = initializers.normal(0.0, 0.5, seed=4)
    low = Table(dim=8, value_dtype=value_dtype, initializer=init, optimizer=optimizer)
    ref = Table(dim=8, initializer=init, optimizer=optimizer)
    pool = np.arange(40)
    for step in range(1, 6):
        keys = rng.choice(pool, 64)  # duplicates, and keys new at this step
        grads = rng.normal(size=(64, 8)).astype(np.float32)
        # The reference starts from the low-precision state, widened: existing rows as they
        # are, new rows as the low table creates them (initializer row and slots, rounded).
        before = low.export()
        new = np.setdiff1d(keys, before["keys"])
        ref.clear()
        if len(before["keys"]):
            ref.import_rows(before["keys"], before["values"].astype(np.float32),
                            before["slots"].astype(np.float32))
        if len(new):
            probe = Table(dim=8, value_dtype=value_dtype, initializer=init, optimizer=optimizer)
            probe.find_or_insert(new)
            p = probe.export()
            ref.import_rows(p["keys"], p["values"].astype(np.float32),
                            p["slots"].astype(np.float32))
            probe.destroy()
        low.apply_gradients(keys, grads, lr=0.01, step=step)
        ref.apply_gradients(keys, grads, lr=0.01, step=step)
        got, want = low.export(), ref.export()
        o_got, o_want = np.argsort(got["keys"]), np.argsort(want["keys"])
        assert np.array_equal(got["keys"][o_got], want["keys"][o_want])
        assert got["values"].dtype == dt and got["slots"].dtype == dt
        assert same_bits(got["values"][o_got], want["values"][o_want].astype(dt))
        assert same_bits(got["slots"][o_got], want["slots"][o_want].astype(dt))
    low.destroy()
    ref.destroy()


@pytest.mark.parametrize("value_dtype", ["float64", "int8", "int32", "int64"])
def test_training_refused_for_float64_and_integers(value_dtype):
    t = Table(dim=2, value_dtype=value_dtype)
    t.insert_or_assign([1, 2], np.array([[1, 2], [3, 4]], NP[value_dtype]))
    before = t.export()
    with pytest.raises(ValueError, match=f"value dtype {value_dtype} cannot be trained; "
                                         "training needs float32, float16 or bfloat16"):
        t.set_optimizer("adam")
    with pytest.raises(ValueError, match=f"value dtype {value_dtype} cannot be trained"):
        t.apply_gradients([1, 3], np.ones((2, 2), np.float32), lr=0.1, step=1)
    with pytest.raises(ValueError, match="cannot be trained"):
        Table(dim=2, value_dtype=value_dtype, optimizer="sgd")
    after = t.export()
    assert t.optimizer is None and t.size() == 2
    for k in before:
        assert np.array_equal(before[k], after[k])
    t.destroy()


@pytest.mark.parametrize("value_dtype", ["int8", "int32", "int64"])
def test_integer_initializers(value_dtype):
    info = np.iinfo(NP[value_dtype])
    t = Table(dim=3, value_dtype=value_dtype, initializer=int(info.max))
    assert np.array_equal(t.find([9])[0], np.full((1, 3), info.max, NP[value_dtype]))
    t.destroy()
    t = Table(dim=3, value_dtype=value_dtype, initializer=np.array([-1, 0, 7]))
    assert np.array_equal(t.initial_values([9]), np.array([[-1, 0, 7]], NP[value_dtype]))
    t.destroy()
    for init in (initializers.normal(), initializers.uniform(), initializers.truncated_normal()):
        with pytest.raises(ValueError, match=f"value dtype {value_dtype} takes only a constant "
                                             f"initializer.*'{init['initializer']}' draws random"):
            Table(dim=3, value_dtype=value_dtype, initializer=init)
    with pytest.raises(ValueError, match="out of the range of " + value_dtype):
        Table(dim=3, value_dtype=value_dtype, initializer=int(info.max) + 1)
    with pytest.raises(ValueError, match="not exactly representable as " + value_dtype):
        Table(dim=3, value_dtype=value_dtype, initializer=0.5)
    with pytest.raises(ValueError, match="not exactly representable as " + value_dtype):
        Table(dim=3, value_dtype=value_dtype, initializer=[1, 2.5, 3])


def test_int64_constant_beyond_double_precision_is_exact():
    t = Table(dim=2, value_dtype="int64", initializer=2**62 + 1)
    assert t.find([3])[0].tolist() == [[2**62 + 1, 2**62 + 1]]
    t.destroy()
    # A list of integers is exact too (JSON integers all the way to the core) ...
    t = Table(dim=1, value_dtype="int64", initializer=[2**62 + 1])
    assert t.find([3])[0].tolist() == [[2**62 + 1]]
    t.destroy()
    # ... a float that large may already be rounded: refused rather than wrong.
    with pytest.raises(ValueError, match="beyond 2\\^53"):
        Table(dim=1, value_dtype="int64", initializer=[2.0**62])


def test_float_initializers_convert_from_the_float32_row():
    init = initializers.uniform(-1, 1, seed=9)
    base = Table(dim=6, initializer=init).initial_values([1, 2, 3])
    for vd in ("float16", "bfloat16", "float64"):
        t = Table(dim=6, value_dtype=vd, initializer=init)
        assert same_bits(t.initial_values([1, 2, 3]), base.astype(NP[vd]))
        t.destroy()
    # A float64 constant is taken as given, not rounded through float32.
    t = Table(dim=2, value_dtype="float64", initializer=0.1)
    assert t.find([1])[0].tolist() == [[0.1, 0.1]]
    t.destroy()


@pytest.mark.parametrize("value_dtype,bad,match", [
    ("int32", np.ones((2, 2), np.float32), "must be integers for an int32 table"),
    ("int8", np.array([[1, 128], [0, 0]]), "outside the table's value dtype int8"),
    ("int64", np.array([[2**63, 0], [0, 0]], np.uint64), "outside the table's value dtype int64"),
    ("float16", np.ones((2, 2), np.int32), "must be floating point for a float16 table"),
    ("float16", np.array([[1e6, 0], [0, 0]]), "beyond the range of the table's value dtype"),
    ("bfloat16", np.array([[1e39, 0], [0, 0]]), "beyond the range of the table's value dtype"),
    ("float32", np.ones((2, 2), np.int64), "must be floating point for a float32 table"),
])
def test_wrong_input_dtype_raises_type_error_table_unchanged(value_dtype, bad, match):
    dt = NP[value_dtype]
    t = Table(dim=2, value_dtype=value_dtype)
    t.insert_or_assign([1, 2], np.array([[1, 2], [3, 4]], dt))
    before = t.export()
    with pytest.raises(TypeError, match=match):
        t.insert_or_assign([1, 5], bad)
    with pytest.raises(TypeError, match=match):
        t.accum([1, 5], bad, [True, False])
    with pytest.raises(TypeError, match=match):
        t.import_rows([1, 5], bad)
    after = t.export()
    for k in before:
        assert np.array_equal(before[k], after[k])
    t.destroy()


def test_floats_round_into_float_tables():
    """Float inputs of another float dtype round to the table's (float64 -> float32 was always
    accepted); the stored row is what numpy's astype gives."""
    x = np.array([[0.1, 1 / 3, 2.5e-6]])
    for vd in ("float32", "float16", "bfloat16", "float64"):
        t = Table(dim=3, value_dtype=vd)
        t.insert_or_assign([1], x)
        assert same_bits(t.find([1])[0], x.astype(NP[vd]))
        t.destroy()


def test_same_id_with_another_value_dtype_is_refused():
    t = Table(dim=4, value_dtype="float16")
    with pytest.raises(ValueError, match="exists with dim 4, value dtype float16"):
        Table(dim=4, value_dtype="float32", table_id=t.id)
    again = Table(dim=4, value_dtype="float16", table_id=t.id)
    assert again.value_dtype == NP["float16"] and Table.attach(t.id).value_dtype == NP["float16"]
    t.destroy()


def test_half_precision_rows_take_half_the_memory():
    n, dim = 50_000, 64
    keys = np.arange(n, dtype=np.int64) * 7919
    sizes = {}
    for vd in ("float32", "float16", "bfloat16"):
        t = Table(dim=dim, value_dtype=vd)
        t.insert_or_assign(keys, np.zeros((n, dim), NP[vd]))
        sizes[vd] = t.memory_bytes()
        t.destroy()
    # Rows are 24 bytes of metadata + dim elements: 280 vs 152 bytes, plus the same index.
    assert sizes["float16"] == sizes["bfloat16"]
    assert sizes["float16"] < 0.62 * sizes["float32"]
    assert sizes["float16"] > n * dim * 2


def test_slots_stored_and_exported_in_the_value_dtype():
    t = Table(dim=3, value_dtype="bfloat16", optimizer={"name": "adagrad", "flavor": "keras",
                                                        "initial_accumulator_value": 0.1})
    t.find_or_insert([5])
    page = t.export()
    assert page["slots"].dtype == BF16
    assert same_bits(page["slots"][0, 0], np.full(3, 0.1, np.float32).astype(BF16))
    # Import takes slots in the dtype too (floats of another dtype round, ints are refused).
    t.import_rows([6], np.ones((1, 3), BF16), slots=np.full((1, 1, 3), 0.25, np.float32))
    assert same_bits(t.export()["slots"][t.export()["keys"] == 6][0, 0], np.full(3, 0.25, BF16))
    with pytest.raises(TypeError, match="slots must be floating point"):
        t.import_rows([7], np.ones((1, 3), BF16), slots=np.ones((1, 1, 3), np.int32))
    assert t.size() == 2
    t.destroy()


def test_redis_backend_refuses_other_value_dtypes():
    """The Redis backend stores float32 rows: another value dtype is refused at creation, before
    any connection (the address is never dialled)."""
    redis = {"redis": {"name": "dtype_test", "addresses": ["127.0.0.1:1"]}}
    try:
        Table(dim=2, value_dtype="float32", backend=redis).destroy()
    except ValueError as e:
        if "built without the Redis backend" in str(e):
            pytest.skip("this build has no Redis backend (hiredis not found at build time)")
    with pytest.raises(ValueError, match="value_dtype 'int32' is not supported by the redis "
                                         "backend"):
        Table(dim=2, value_dtype="int32", backend=redis)
