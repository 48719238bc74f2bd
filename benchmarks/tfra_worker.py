"""The TFRA side of benchmarks/compare_tfra.py, run as a subprocess in a TFRA 0.8.1 virtualenv.

It speaks JSON lines on stdin/stdout (one request, one reply) and keeps its tables between
requests, so the driver can alternate dualemb and TFRA measurements in one run. TFRA runs in eager
mode with every table op wrapped in a `tf.function` (its fast path in TF2: no per-op Python
dispatch); results are brought to numpy (`.numpy()`), as dualemb's numpy API returns them.

The workload generators (`preload_keys`, `batch`, `fit_batches`) are pure numpy and shared with
the driver, so both sides see identical keys and values for the same seeds. So is the model.fit
benchmark (`build_fit_model`, `FitRunner`): it takes the `tf`, `keras` and `de` modules of its side
(TFRA: tf_keras + `tensorflow_recommenders_addons.dynamic_embedding`; dualemb: Keras 3 +
`dualemb.tf`), so the two sides run the same code on the two APIs.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

_ODD = np.uint64(0x9E3779B97F4A7C15)
_MASK63 = np.uint64((1 << 63) - 1)


def key_of(index: np.ndarray, salt: int = 0) -> np.ndarray:
    """A bijection of [0, 2**63) scattering consecutive indices over int64 (unique, positive)."""
    i = (np.asarray(index, np.uint64) + np.uint64(salt)) & _MASK63
    with np.errstate(over="ignore"):
        return ((i * _ODD) & _MASK63).astype(np.int64)


def preload_keys(n: int) -> np.ndarray:
    return key_of(np.arange(n, dtype=np.uint64))


def preload_values(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)


def batch(workload: str, n_present: int, size: int, dim: int, seed: int):
    """(keys, values or None) of one batch. Present keys are drawn from the preloaded indices
    [0, n_present); missing keys from indices >= n_present (never inserted)."""
    rng = np.random.default_rng(seed)
    if workload == "lookup_missing":
        idx = rng.integers(0, n_present, size, dtype=np.int64)
        miss = rng.random(size) < 0.5
        idx[miss] = n_present + rng.integers(0, 1 << 40, int(miss.sum()), dtype=np.int64)
    else:
        idx = rng.integers(0, n_present, size, dtype=np.int64)
    keys = key_of(idx.astype(np.uint64))
    values = (rng.standard_normal((size, dim), dtype=np.float32) if workload == "upsert"
              else None)
    return keys, values


def time_table_ops(fns: dict, batches: list, workload: str, iters: int) -> list:
    """Seconds per call of fns["upsert"](keys, values) or fns["lookup"](keys), cycling through
    `batches`; the first call traces / warms up and is not counted. Both sides use this."""
    times = []
    for j in range(iters + 1):
        k, v = batches[j % len(batches)]
        t0 = time.perf_counter()
        if workload == "upsert":
            fns["upsert"](k, v)
        else:
            fns["lookup"](k).numpy()
        dt = time.perf_counter() - t0
        if j:
            times.append(dt)
    return times


def rss_mb() -> dict:
    """Current and peak resident memory of this process (MiB), from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out["rss" if line.startswith("VmRSS") else "peak"] = int(line.split()[1]) / 1024
    return out


def trim() -> None:
    """Returns freed heap memory to the OS (glibc malloc_trim), so that RSS deltas measured
    next are not hidden by memory the allocator kept from earlier phases."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak() -> None:
    """Resets VmHWM to the current RSS (Linux clear_refs 5), so peaks are per phase."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ---- model.fit benchmark (shared by both sides) -----------------------------------------------

FIT_DEFAULTS = {
    "features": 8,          # sparse features, one dynamic Embedding layer each
    "dim": 16,              # embedding size
    "vocab": 10_000_000,    # ids: numpy zipf(zipf_a) ranks hashed into [0, vocab)
    "zipf_a": 1.2,
    "batch": 4096,
    "hidden": [64, 32],     # Dense relu layers, then Dense(1) (logits) + binary cross-entropy
    "lr": 1e-3,             # Adam inside de.DynamicEmbeddingOptimizer
    "steps": 30,            # steps_per_epoch
    "epochs": 2,            # epochs per timed model.fit call (one call per side per round)
    "rounds": 6,            # alternating rounds (even: each side goes first equally often)
    "warmup": 5,            # steps of an untimed first model.fit (tracing, first inserts)
    "lookup_iters": 20,     # per side per round, layer-forward lookups of one batch
    "seed": 0,
}


def fit_spec(spec: dict | None) -> dict:
    out = dict(FIT_DEFAULTS)
    out.update({k: v for k, v in (spec or {}).items() if v is not None})
    return out


_ZIPF_TAIL = 2.0 ** 30


def zipf_ranks(rng, a: float, n: int) -> np.ndarray:
    """n Zipf(a) ranks (P(k) ~ k**-a, k >= 1), as numpy's Generator.zipf (Devroye's rejection
    method) but written out on rng.random, because Generator.zipf itself draws different values
    in numpy 1.26 (the TFRA venv) and numpy 2: this gives the same ranks in both. Ranks >= 2**30
    (about 1.6% at a=1.2, where float rounding could differ between numpy builds) come back as 0
    and are replaced by the caller with a uniform id, which is what hashing such a rank gives."""
    am1 = a - 1.0
    b = 2.0 ** am1
    parts, have = [], 0
    while have < n:
        m = int((n - have) * 1.3) + 64
        u = 1.0 - rng.random(m)
        v = rng.random(m)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            x = np.floor(u ** (-1.0 / am1))
            t = (1.0 + 1.0 / x) ** am1
            ok = (x >= 1) & (x < 2.0 ** 62) & (v * x * (t - 1.0) / (b - 1.0) <= t / b)
        parts.append(x[ok])
        have += int(ok.sum())
    x = np.concatenate(parts)[:n]
    x[x >= _ZIPF_TAIL] = 0
    return x.astype(np.uint64)


def fit_batches(spec: dict, start: int, count: int):
    """Batches [start, start + count) of the fit workload: ids int64 [count, batch, features]
    (feature f: key_of(zipf rank + f * 2**40) % vocab, so features do not share ids) and labels
    float32 [count, batch, 1] (Bernoulli 0.25). Batch j depends only on (seed, j), and is the
    same in the TFRA venv's numpy 1.26 and numpy 2 (see zipf_ranks; the checksum checks it)."""
    b, f = spec["batch"], spec["features"]
    ids = np.empty((count, b, f), np.int64)
    labels = np.empty((count, b, 1), np.float32)
    salt = np.arange(f, dtype=np.uint64) << np.uint64(40)
    for j in range(count):
        rng = np.random.default_rng([spec["seed"], start + j])
        ranks = zipf_ranks(rng, spec["zipf_a"], b * f).reshape(b, f)
        uniform = rng.integers(0, spec["vocab"], (b, f), dtype=np.int64)
        with np.errstate(over="ignore"):
            ids[j] = np.where(ranks == 0, uniform,
                              key_of(ranks + salt) % np.int64(spec["vocab"]))
        labels[j] = rng.random((b, 1)) < 0.25
    return ids, labels


def build_fit_model(keras, de, spec: dict, **layer_kwargs):
    """Inputs f0..f{F-1} int64 [B, 1] -> de Embedding(dim, **layer_kwargs) each -> concat -> MLP
    -> 1 logit; Adam wrapped in de.DynamicEmbeddingOptimizer, binary cross-entropy. Returns
    (model, layers)."""
    dim = spec["dim"]
    inputs = [keras.Input((1,), dtype="int64", name=f"f{i}") for i in range(spec["features"])]
    layers = [de.keras.layers.Embedding(dim, name=f"fit_emb{i}", **layer_kwargs)
              for i in range(len(inputs))]
    x = keras.layers.Concatenate()(
        [keras.layers.Reshape((dim,))(layer(inp)) for layer, inp in zip(layers, inputs)])
    for k, units in enumerate(spec["hidden"]):
        x = keras.layers.Dense(units, activation="relu",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=k + 1))(x)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=99))(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(spec["lr"])),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model, layers


class FitRunner:
    """One side of the model.fit benchmark. `setup` generates every batch it will train on
    (warm-up + rounds x epochs x steps, all distinct, so the Zipf tail keeps inserting new ids as
    in real training) and runs an untimed warm-up fit; `round(r)` is one model.fit of `epochs`
    epochs of `steps` steps on batches not seen before, timed per epoch by a callback; `lookup`
    times the forward pass of the Embedding layers alone (tf.function, all features of a
    trained batch: features x batch keys per call)."""

    def __init__(self, tf, keras, de, spec: dict):
        self.tf, self.keras, self.de = tf, keras, de
        self.spec = fit_spec(spec)

    def _dataset(self, start: int, count: int):
        ids, labels = self.ids[start:start + count], self.labels[start:start + count]
        feats = {f"f{i}": ids[:, :, i:i + 1] for i in range(self.spec["features"])}
        return self.tf.data.Dataset.from_tensor_slices((feats, labels))

    def setup(self) -> dict:
        tf, sp = self.tf, self.spec
        total = sp["warmup"] + sp["rounds"] * sp["epochs"] * sp["steps"]
        t0 = time.perf_counter()
        self.ids, self.labels = fit_batches(sp, 0, total)
        gen_s = time.perf_counter() - t0
        self.model, self.layers = build_fit_model(self.keras, self.de, sp)
        t0 = time.perf_counter()
        self.model.fit(self._dataset(0, sp["warmup"]), steps_per_epoch=sp["warmup"], epochs=1,
                       verbose=0, shuffle=False)
        warmup_s = time.perf_counter() - t0
        layers = self.layers

        def forward(ids):
            return tf.concat([layer(ids[:, i]) for i, layer in enumerate(layers)], axis=1)

        self.forward = tf.function(forward)
        return {"batches": total, "generate_s": gen_s, "warmup_fit_s": warmup_s,
                "ids_checksum": int(self.ids.sum(dtype=np.uint64) % np.uint64(1 << 61)),
                "threads": {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                            "inter": tf.config.threading.get_inter_op_parallelism_threads()},
                **rss_mb()}

    def round(self, r: int) -> dict:
        sp, keras = self.spec, self.keras
        epoch_s = []

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.t0 = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                epoch_s.append(time.perf_counter() - self.t0)

        start = sp["warmup"] + r * sp["epochs"] * sp["steps"]
        ds = self._dataset(start, sp["epochs"] * sp["steps"])
        t0 = time.perf_counter()
        hist = self.model.fit(ds, steps_per_epoch=sp["steps"], epochs=sp["epochs"], verbose=0,
                              shuffle=False, callbacks=[Timer()])
        fit_s = time.perf_counter() - t0
        return {"epoch_s": epoch_s, "fit_s": fit_s,
                "loss": [float(x) for x in hist.history["loss"]],
                "rows": [int(layer.params.size()) for layer in self.layers],
                "load_avg": os.getloadavg()[0], **rss_mb()}

    def lookup(self, r: int) -> list:
        """Seconds per forward of the Embedding layers on one trained batch (first call, which
        traces, not counted)."""
        tf, sp = self.tf, self.spec
        trained = sp["warmup"] + sp["rounds"] * sp["epochs"] * sp["steps"]
        if not hasattr(self, "_lookup_batches"):
            self._lookup_batches = [tf.constant(self.ids[(j * 7919) % trained])
                                    for j in range(4)]
        bs = self._lookup_batches
        times = []
        for j in range(sp["lookup_iters"] + 1):
            k = bs[(j + r) % len(bs)]
            t0 = time.perf_counter()
            self.forward(k).numpy()
            dt = time.perf_counter() - t0
            if j:
                times.append(dt)
        return times

    def drop(self) -> dict:
        for name in ("model", "layers", "forward", "ids", "labels", "_lookup_batches"):
            self.__dict__.pop(name, None)
        import gc
        gc.collect()
        trim()
        return rss_mb()


class KvRunner:
    """One side of benchmarks/bench_redis.py: tables made through the TFRA API of the `tf`, `de`
    modules it is given (TFRA: TF 2.16 + `tensorflow_recommenders_addons.dynamic_embedding`;
    dualemb: `dualemb.tf`), so both sides run this same code. Per (backend, dim) one Variable,
    `de.get_variable(..., kv_creator=de.RedisTableCreator(de.RedisTableConfig(config_path)))`
    for "redis", the side's default (in-memory) creator for "memory"; zeros initializer; ops in
    tf.function, timed by `time_table_ops` (the loop compare_tfra.py uses too)."""

    def __init__(self, tf, de, redis_config_path: str, prefix: str):
        self.tf, self.de = tf, de
        self.config_path, self.prefix = redis_config_path, prefix
        self.vars, self.fns, self.batches, self.preloaded = {}, {}, {}, {}

    def call(self, action: str, **kw):
        if action not in ("setup", "time", "snapshot", "probe", "drop"):
            raise ValueError(f"unknown kv action {action!r}")
        return getattr(self, action)(**kw)

    def setup(self, backend: str, dim: int, n: int, seed: int, chunk: int = 65536) -> dict:
        tf, de = self.tf, self.de
        kw = {}
        if backend == "redis":
            kw["kv_creator"] = de.RedisTableCreator(
                de.RedisTableConfig(redis_config_abs_dir=self.config_path))
        elif backend != "memory":
            raise ValueError(f"unknown backend {backend!r}")
        var = de.get_variable(f"{self.prefix}_{backend}_{dim}", key_dtype=tf.int64,
                              value_dtype=tf.float32, dim=dim,
                              initializer=tf.keras.initializers.Zeros(), **kw)

        def _upsert(k, v):
            var.upsert(k, v)  # returns an Operation, which tf.function cannot return

        fns = {"upsert": tf.function(_upsert), "lookup": tf.function(lambda k: var.lookup(k))}
        keys, values = preload_keys(n), preload_values(n, dim, seed)
        t0 = time.perf_counter()
        for s in range(0, n, chunk):  # bounded request size for Redis on both sides
            fns["upsert"](tf.constant(keys[s:s + chunk]), tf.constant(values[s:s + chunk]))
        preload_s = time.perf_counter() - t0
        size = int(var.size())
        self.vars[(backend, dim)], self.fns[(backend, dim)] = var, fns
        self.preloaded[dim] = (n, seed)
        return {"preload_s": preload_s, "size": size}

    def time(self, backend: str, workload: str, dim: int, size: int, n_present: int,
             iters: int, seed: int) -> list:
        key = (workload, dim, size, seed)
        if key not in self.batches:
            tf = self.tf
            self.batches[key] = [
                tuple(None if a is None else tf.constant(a)
                      for a in batch(workload, n_present, size, dim, seed * 1000 + j))
                for j in range(4)]
        return time_table_ops(self.fns[(backend, dim)], self.batches[key], workload, iters)

    def _probe_keys(self, dim: int, count: int):
        n, _ = self.preloaded[dim]
        return self.tf.constant(key_of(np.arange(0, n, max(1, n // count))[:count]))

    def snapshot(self, dim: int, count: int = 64) -> dict:
        """Reads `count` stored keys of the Redis table (server running) as the reference for
        `probe`: the upsert benchmark has overwritten some of the preloaded rows."""
        self.reference = self.fns[("redis", dim)]["lookup"](self._probe_keys(dim, count)).numpy()
        return {"keys": count, "all_zeros": bool(not self.reference.any())}

    def probe(self, dim: int, count: int = 64) -> dict:
        """Looks up the `snapshot` keys again (the driver may have paused the server): the error
        text if it raised, else whether the rows are the stored ones or the zeros default."""
        t0 = time.perf_counter()
        try:
            rows = self.fns[("redis", dim)]["lookup"](self._probe_keys(dim, count)).numpy()
        except Exception as e:  # noqa: BLE001 (the probe reports what happened)
            text = str(e).strip()
            first = text.splitlines()[0][:500] if text else ""
            return {"seconds": time.perf_counter() - t0,
                    "raised": f"{type(e).__name__}: {first}".rstrip(": ")}
        return {"seconds": time.perf_counter() - t0, "raised": None,
                "rows_equal_stored": int(np.all(rows == self.reference, axis=1).sum()),
                "rows_all_zeros_default": int((~rows.any(axis=1)).sum()), "keys": count}

    def drop(self, dim: int) -> dict:
        for backend in ("redis", "memory"):
            self.vars.pop((backend, dim), None)
            self.fns.pop((backend, dim), None)
        self.batches = {k: v for k, v in self.batches.items() if k[1] != dim}
        # get_variable's store (TFRA's and dualemb's alike: the default graph's) holds the
        # variables too; a fresh default graph lets them go.
        self.tf.compat.v1.reset_default_graph()
        return {}


class TfraSide:
    """TFRA tables: per dim one with a zeros default ("zeros") and one with RandomNormal
    ("normal"), both preloaded with the same rows."""

    def __init__(self):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        import tensorflow as tf
        from tensorflow_recommenders_addons import dynamic_embedding as de
        import tensorflow_recommenders_addons as tfra
        self.tf, self.de = tf, de
        self.vars = {}
        self.fns = {}
        self.batches = {}
        self.info = {"tf_version": tf.__version__, "tfra_version": tfra.__version__,
                     "mode": "eager, ops wrapped in tf.function",
                     "threads": {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                                 "inter": tf.config.threading.get_inter_op_parallelism_threads()}}

    def setup(self, dim: int, n: int, seed: int) -> dict:
        tf, de = self.tf, self.de
        import gc
        gc.collect()
        trim()
        before = rss_mb()["rss"]
        reset_peak()
        keys, values = preload_keys(n), preload_values(n, dim, seed)
        out = {}
        for kind in ("zeros", "normal"):
            init = (None if kind == "zeros"
                    else tf.keras.initializers.RandomNormal(mean=0.0, stddev=1.0, seed=seed))
            var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                              name=f"bench_{kind}_{dim}", initializer=init, init_size=n)
            def _upsert(k, v, var=var):
                var.upsert(k, v)  # returns an Operation, which tf.function cannot return

            upsert = tf.function(_upsert)
            k_t, v_t = tf.constant(keys), tf.constant(values)
            t0 = time.perf_counter()
            upsert(k_t, v_t)
            out[f"preload_{kind}_s"] = time.perf_counter() - t0
            del k_t, v_t
            self.vars[(kind, dim)] = var
            self.fns[(kind, dim)] = {
                "upsert": upsert,
                "lookup": tf.function(lambda k, var=var: var.lookup(k)),
            }
            assert int(var.size()) == n
        del keys, values
        mem = rss_mb()
        out.update(rss_before_mb=before, rss_after_mb=mem["rss"], peak_mb=mem["peak"])
        return out

    def drop(self, dim: int) -> dict:
        for kind in ("zeros", "normal"):
            self.vars.pop((kind, dim), None)
            self.fns.pop((kind, dim), None)
        self.batches = {k: v for k, v in self.batches.items() if k[1] != dim}
        import gc
        gc.collect()
        return rss_mb()

    def _batches(self, workload, dim, size, n_present, seed, count):
        key = (workload, dim, size, seed)
        if key not in self.batches:
            tf = self.tf
            bs = []
            for j in range(count):
                k, v = batch(workload, n_present, size, dim, seed * 1000 + j)
                bs.append((tf.constant(k), None if v is None else tf.constant(v)))
            self.batches[key] = bs
        return self.batches[key]

    def time(self, workload: str, dim: int, size: int, n_present: int, iters: int,
             seed: int) -> list:
        kind = "normal" if workload == "lookup_missing" else "zeros"
        fns = self.fns[(kind, dim)]
        bs = self._batches(workload, dim, size, n_present, seed, 4)
        return time_table_ops(fns, bs, workload, iters)

    def checkpoint(self, dim: int, directory: str) -> dict:
        tf = self.tf
        var = self.vars[("zeros", dim)]
        n = int(var.size())
        import gc
        gc.collect()
        trim()
        rss0 = rss_mb()["rss"]
        reset_peak()
        ckpt = tf.train.Checkpoint(emb=var)
        prefix = os.path.join(directory, "tfra_ckpt")
        t0, c0 = time.perf_counter(), time.process_time()
        path = ckpt.write(prefix)
        save_s, save_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                   if f.startswith("tfra_ckpt"))
        save_peak = rss_mb()["peak"]
        reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        ckpt.read(path).assert_consumed()
        restore_s, restore_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        assert int(var.size()) == n
        out = {"save_s": save_s, "restore_s": restore_s, "bytes": size,
               "save_cpu_s": save_cpu_s, "restore_cpu_s": restore_cpu_s,
               "save_extra_mb": save_peak - rss0, "restore_extra_mb": rss_mb()["peak"] - rss0}
        # TFRA's other format: FileSystemSaver raw files (no TF checkpoint machinery).
        fs_dir = os.path.join(directory, "tfra_fs")
        t0 = time.perf_counter()
        var.save_to_file_system(fs_dir)
        out["fs_save_s"] = time.perf_counter() - t0
        out["fs_bytes"] = dir_bytes(fs_dir)
        var.clear()
        t0 = time.perf_counter()
        var.load_from_file_system(fs_dir)
        out["fs_restore_s"] = time.perf_counter() - t0
        assert int(var.size()) == n
        return out

    def kv(self, action: str, **kw):
        """benchmarks/bench_redis.py: action "init" (redis_config_path, prefix) makes a KvRunner
        on TFRA; the others ("setup", "time", "snapshot", "probe", "drop")
        go to it."""
        if action == "init":
            self.kv_runner = KvRunner(self.tf, self.de, **kw)
            return {}
        return self.kv_runner.call(action, **kw)

    def fit(self, action: str, spec: dict | None = None, r: int = 0):
        """The model.fit comparison (FitRunner on tf_keras + TFRA): action "setup" (with spec),
        "round" (timed model.fit number r), "lookup" (layer-forward timings) or "drop"."""
        if action == "setup":
            self.fitter = FitRunner(self.tf, self.tf.keras, self.de, spec)
            return self.fitter.setup()
        if action == "round":
            return self.fitter.round(r)
        if action == "lookup":
            return self.fitter.lookup(r)
        if action == "drop":
            out = self.fitter.drop()
            self.fitter = None
            return out
        raise ValueError(f"unknown fit action {action!r}")


def main() -> None:
    side = None
    out = sys.stdout
    sys.stdout = sys.stderr  # anything TF prints goes to stderr, never into the protocol
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            if op == "quit":
                break
            if side is None:
                side = TfraSide()
            if op == "info":
                res = {**side.info, **rss_mb()}
            elif op == "rss":
                res = rss_mb()
            else:
                res = getattr(side, op)(**req)
            reply = {"ok": True, "result": res}
        except Exception as e:  # noqa: BLE001 (reported to the driver)
            import traceback
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
