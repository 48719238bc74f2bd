"""JSON specs round-trip through the C++ core with exact types and values, and the core's
canonical text equals Python's byte for byte (property tests over random specs, fixed seeds)."""

import json
import math
import struct

import numpy as np
import pytest

from dualemb.core import spec as spec_mod
from dualemb.core.table import Table, _core

SEEDS = range(4)
CASES_PER_SEED = 75  # 300 random table configs and 300 random optimizer specs in all


def exact(value):
    """A comparison key that tells apart what == does not: int vs float vs bool, -0.0 vs 0.0,
    and every bit of a float."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, list):
        return ("list", tuple(exact(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, exact(v)) for k, v in value.items())))
    if value is None:
        return ("null",)
    return (type(value).__name__, value)


def random_float(rng, lo=-math.inf, hi=math.inf):
    """A finite double in [lo, hi] drawn from several regimes: any bit pattern, subnormals,
    huge and tiny magnitudes, short decimals, the [1e15, 1e17) band where number formatters
    differ, and exact zeros."""
    for _ in range(1000):
        kind = rng.integers(7)
        if kind == 0:  # any finite bit pattern
            v = struct.unpack("<d", rng.integers(0, 1 << 64, dtype=np.uint64).tobytes())[0]
        elif kind == 1:  # subnormal
            bits = int(rng.integers(1, 1 << 52, dtype=np.uint64)) | (int(rng.integers(2)) << 63)
            v = struct.unpack("<d", struct.pack("<Q", bits))[0]
        elif kind == 2:  # any magnitude
            v = float(rng.normal()) * 10.0 ** int(rng.integers(-320, 309))
        elif kind == 3:  # a short decimal, as people write them
            v = round(float(rng.normal()), int(rng.integers(0, 6)))
        elif kind == 4:  # where %.17g / Grisu / repr disagree on notation
            v = float(rng.uniform(1e15, 1e17)) * (1 if rng.integers(2) else -1)
        elif kind == 5:
            v = float(rng.choice([0.0, -0.0, 1.0, 0.5, 1e-7, 0.9, 0.999]))
        else:  # unit interval
            v = float(rng.random())
        if math.isfinite(v) and lo <= v <= hi:
            return v
    return float(lo if math.isfinite(lo) else 0.0)


def random_number(rng, lo=-math.inf, hi=math.inf):
    """A float, or (a third of the time) an int, in [lo, hi]."""
    if rng.integers(3) == 0:
        a = max(lo, -(1 << 62)) if math.isfinite(lo) else -(1 << 62)
        b = min(hi, 1 << 62) if math.isfinite(hi) else 1 << 62
        a, b = math.ceil(a), math.floor(b)
        if a <= b:
            small = int(rng.integers(max(a, -1000), min(b, 1000) + 1)) if max(a, -1000) <= min(
                b, 1000) else a
            return small if rng.integers(2) else int(rng.integers(a, b, endpoint=True,
                                                                  dtype=np.int64))
    return random_float(rng, lo, hi)


def random_table_config(rng) -> dict:
    dim = int(rng.integers(1, 33))
    kind = str(rng.choice(["zeros", "constant", "vector", "normal", "truncated_normal",
                           "uniform"]))
    config = {"dim": dim, "key_dtype": str(rng.choice(["int64", "int32"])),
              "value_dtype": "float32", "initializer": kind,
              "capacity": [0, int(rng.integers(1, 1 << 62))][int(rng.integers(2))],
              "evict_policy": str(rng.choice(["recency", "frequency"]))}
    seed = [0, (1 << 64) - 1, int(rng.integers(0, 1 << 63))][int(rng.integers(3))]
    if kind == "constant":
        config["value"] = random_number(rng)
    elif kind == "vector":
        n = dim if rng.integers(2) else 1
        config["values"] = [random_number(rng, -3e38, 3e38) for _ in range(n)]
    elif kind in ("normal", "truncated_normal"):
        config.update(seed=seed, mean=random_number(rng), stddev=random_number(rng, 0.0))
    elif kind == "uniform":
        a, b = sorted([random_number(rng), random_number(rng)])
        config.update(seed=seed, minval=a, maxval=b)
    return config


OPTIMIZERS = [(n, f) for n in ("sgd", "adagrad", "adam", "adamw", "adamax", "nadam", "rmsprop",
                               "adadelta", "lion") for f in ("keras", "optax")] + [("ftrl", "keras")]


def described(spec: dict) -> dict:
    """The core's full form of an optimizer spec (members not given filled with defaults)."""
    t = Table(dim=1, optimizer=spec)
    try:
        return t.optimizer
    finally:
        t.destroy()


def accepted(spec) -> bool:
    try:
        _core.set_optimizer(PROBE.id, spec_mod.to_spec(spec))
        return True
    except ValueError:
        return False


PROBE = Table(dim=1)


def random_optimizer(rng) -> dict:
    """A full canonical spec: every hyper-parameter present, each drawn at random among values
    the core accepts (a hyper-parameter keeps its default if 50 draws are all out of range)."""
    name, flavor = OPTIMIZERS[int(rng.integers(len(OPTIMIZERS)))]
    spec = described({"name": name, "flavor": flavor})
    for key, default in list(spec.items()):  # flags first: they decide which reals exist
        if isinstance(default, bool):
            trial = dict(spec, **{key: bool(rng.integers(2))})
            if accepted(trial):
                spec = trial
    spec = described(spec)  # e.g. amsgrad=true brings bias_correction_mu/nu
    for key, default in list(spec.items()):
        if key in ("name", "flavor") or isinstance(default, bool):
            continue
        for _ in range(50):
            scale = rng.integers(3)
            v = (random_number(rng, -1.0, 1.0) if scale == 0 else
                 random_number(rng, 0.0, 1.0) if scale == 1 else random_number(rng))
            trial = dict(spec, **{key: v})
            if accepted(trial):
                spec = trial
                break
    return spec


@pytest.mark.parametrize("seed", SEEDS)
def test_table_configs_round_trip_exactly(seed):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(CASES_PER_SEED):
        config = random_table_config(rng)
        text = spec_mod.to_spec(config)
        tid = _core.create(0, text)
        try:
            described = _core.describe(tid)
        finally:
            _core.destroy(tid)
        back, opt = spec_mod.parse_description(described)
        assert exact(back) == exact(config), (config, back)
        assert opt is None
        # (b) byte for byte: the core's text is Python's canonical dump of the same object
        assert described == spec_mod.canonical({"config": config, "optimizer": None})


@pytest.mark.parametrize("seed", SEEDS)
def test_optimizer_specs_round_trip_exactly(seed):
    rng = np.random.default_rng(2000 + seed)
    for _ in range(CASES_PER_SEED):
        opt = random_optimizer(rng)
        t = Table(dim=2, optimizer=opt)
        try:
            described = _core.describe(t.id)
        finally:
            t.destroy()
        config, back = spec_mod.parse_description(described)
        assert exact(back) == exact(opt), (opt, back)
        assert described == spec_mod.canonical({"config": config, "optimizer": opt})


def random_json(rng, depth=0):
    """Any JSON value: strings with every kind of character (ASCII controls, DEL, quotes,
    backslashes, BMP and astral code points), ints of every size, floats of every regime."""
    kind = int(rng.integers(7 if depth < 3 else 4))
    if kind == 0:
        chars = []
        for _ in range(int(rng.integers(0, 12))):
            band = rng.integers(5)
            cp = int(rng.integers(0, 0x20) if band == 0 else rng.integers(0x20, 0x80) if band == 1
                     else rng.integers(0x80, 0xD800) if band == 2
                     else rng.integers(0xE000, 0x10000) if band == 3
                     else rng.integers(0x10000, 0x110000))
            chars.append(chr(cp))
        return "".join(chars)
    if kind == 1:
        return [int(rng.integers(-(1 << 63), (1 << 63) - 1, dtype=np.int64)),
                int(rng.integers(0, (1 << 64) - 1, dtype=np.uint64)),
                int(rng.integers(-5, 6))][int(rng.integers(3))]
    if kind == 2:
        return random_float(rng)
    if kind == 3:
        return [None, True, False][int(rng.integers(3))]
    if kind in (4, 5):
        return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    return {random_json_key(rng): random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))}


def random_json_key(rng):
    s = random_json(rng, 99) if rng.integers(2) else f"k{int(rng.integers(100))}"
    return s if isinstance(s, str) else str(s)


@pytest.mark.parametrize("seed", SEEDS)
def test_canonical_text_agrees_on_any_json(seed):
    """The core's canonical writer (used by describe) against json.dumps, on arbitrary values,
    fed to the core in non-canonical form (spaces, unsorted members, raw UTF-8)."""
    rng = np.random.default_rng(3000 + seed)
    for _ in range(CASES_PER_SEED):
        value = random_json(rng)
        loose = json.dumps(value, ensure_ascii=bool(rng.integers(2)), indent=int(rng.integers(3)))
        assert _core.canonical_json(loose) == spec_mod.canonical(value)


@pytest.mark.parametrize("value,text", [
    (1e15, "1000000000000000.0"),  # nlohmann's own dump writes 1e+15
    (1e16, "1e+16"),
    (1e-4, "0.0001"),
    (1e-5, "1e-05"),
    (5e-324, "5e-324"),
    (-0.0, "-0.0"),
    (0.1, "0.1"),
    (123456789012345678.0, "1.2345678901234568e+17"),
])
def test_float_text(value, text):
    assert spec_mod.canonical(value) == text
    assert _core.canonical_json(repr(value)) == text


def test_the_reported_losses_are_gone():
    """The three defects of the old "name=value" text: [0.5] came back as 0.5, [1, 2] as
    [1.0, 2.0], and the string 'nan' as a float."""
    for values in ([0.5], [1, 2]):
        t = Table(dim=2, initializer={"initializer": "vector", "values": values})
        assert exact(t.initializer["values"]) == exact(values)
        t.destroy()
    assert exact(spec_mod.from_spec(spec_mod.to_spec({"s": "nan"}))) == exact({"s": "nan"})


def test_equal_optimizer_specs_keep_slots():
    """0 and 0.0 are the same hyper-parameter: re-attaching keeps the trained slots."""
    t = Table(dim=2, optimizer={"name": "sgd", "flavor": "keras", "momentum": 0.5})
    t.apply_gradients(np.array([1, 2]), np.ones((2, 2), np.float32), 0.1, 1)
    before = t.export()["slots"].copy()
    assert np.abs(before).sum() > 0
    t.set_optimizer({"name": "sgd", "flavor": "keras", "momentum": 0.5, "nesterov": False})
    np.testing.assert_array_equal(t.export()["slots"], before)
    t.destroy()


@pytest.mark.parametrize("config,message", [
    ('{"dim": 2, "dim": 3}', "'dim' given twice"),
    ('{"dim": 2.0}', "'dim' must be an integer"),
    ('{"dim": true}', "'dim' must be an integer"),
    ('{"dim": 2, "initializer": "normal", "seed": -1}', "'seed' must be an integer in \\[0"),
    ('{"dim": 2, "initializer": "normal", "seed": 18446744073709551616}', "'seed' must be an "
                                                                          "integer"),
    ('{"dim": 2, "initializer": "normal", "mean": "nan"}', "'mean' must be a number, got a "
                                                             "string"),
    ('{"dim": 2, "initializer": "constant", "value": NaN}', "not valid JSON"),
    ('{"dim": 2, "initializer": "constant", "value": 1e400}', "not valid JSON"),
    ('{"dim": 2, "initializer": "vector", "values": 0.5}', "'values' must be a list"),
    ('{"dim": 2, "initializer": "vector", "values": [1, "a"]}', "'values' must be a list"),
    ('{"dim": 2, "initializer": "zeros", "seed": 3}', "'seed' does not apply to initializer "
                                                      "'zeros'"),
    ('{"dim": 2, "initializer": "normal", "minval": 3}', "'minval' does not apply"),
    ('{"dim": 2, "bogus": 1}', "unknown table config parameter 'bogus'"),
    ('[2]', "must be a JSON object"),
    ("dim=2", "not valid JSON"),
])
def test_bad_table_configs_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        _core.create(0, config)


@pytest.mark.parametrize("spec,message", [
    ('{"name": "adam", "beta_1": "0.9"}', "'beta_1' must be a number, got a string"),
    ('{"name": "adam", "amsgrad": 1}', "'amsgrad' must be true or false"),
    ('{"name": "adam", "beta_1": 1e-400, "beta_1": 0.5}', "given twice"),
    ('{"name": "adam", "bogus": 1}', "bogus"),
    ('{"flavor": "keras"}', 'no "name" member'),
])
def test_bad_optimizer_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        _core.set_optimizer(PROBE.id, spec)


@pytest.mark.parametrize("entries,message", [
    ({"x": float("nan")}, "not finite"),
    ({"x": [1.0, float("inf")]}, "not finite"),
    ({"x": 1 << 64}, "outside the integer range"),
    ({"x": object()}, "not a JSON value"),
])
def test_python_refuses_what_json_cannot_carry(entries, message):
    with pytest.raises(ValueError, match=message):
        spec_mod.to_spec(entries)


def test_python_types_survive_to_spec():
    entries = {"f": np.float32(0.1), "i": np.int64(-3), "a": np.array([1.5, 2.0]),
               "t": (1, 2), "b": np.bool_(True), "skip": None}
    back = spec_mod.from_spec(spec_mod.to_spec(entries))
    assert exact(back) == exact({"f": float(np.float32(0.1)), "i": -3, "a": [1.5, 2.0],
                                 "t": [1, 2], "b": True})


def test_old_spec_text_is_refused_with_a_pointer():
    with pytest.raises(ValueError, match="no longer accepted; pass a dict"):
        Table(dim=2, optimizer="name=adam;flavor=keras")
