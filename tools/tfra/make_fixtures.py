#!/usr/bin/env python
"""Writes small TFRA 0.8.1 checkpoints for dualemb's importer tests (tests/tf/test_tf_migrate.py).

Run it with a virtualenv that has the real TFRA (NOT part of the test run; CI never runs it):

    python3.11 -m venv /work/tfra-venv
    /work/tfra-venv/bin/pip install tensorflow==2.16.2 tensorflow-recommenders-addons==0.8.1 \
        "tf_keras~=2.16.0"
    /work/tfra-venv/bin/python tools/tfra/make_fixtures.py [--out tests/fixtures/tfra]

TFRA on TF 2.16 needs the legacy Keras 2 (`tf_keras`, `TF_USE_LEGACY_KERAS=1`): its
DynamicEmbeddingOptimizer rejects Keras 3 optimizers. This script sets the variable itself.

Fixtures (each directory has `expected.json`, written from TFRA's own per-shard `export()` of
every table right after saving, so the tests can compare the importer's rows bit for bit):

  tf2_checkpoint/    eager `tf.train.Checkpoint(emb=var, opt=opt)` of `de.Variable("user/emb")`,
                     2 CPU shards, dim 4, int64 keys (negative and > 2**31 included), trained two
                     steps by `DynamicEmbeddingOptimizer(tf_keras Adam)`, so slot tables m, v exist.
  v1_saver/          graph mode (TF1 style): `tf.compat.v1.train.Saver` of `model/emb` (a
                     variable_scope), 2 shards, trained two steps by TF1 `AdamOptimizer`.
  keras_save_weights/  a Keras model with `de.keras.layers.Embedding` (2 shards) trained with
                     `model.fit` and saved with `model.save_weights` (default, in-checkpoint saver).
  keras_fs_saver/    the same model with
                     `kv_creator=CuckooHashTableCreator(saver=FileSystemSaver())`, saved with
                     `de.train.Checkpoint`: the TF checkpoint holds only
                     `shard_upsert_restore` flags; rows are in `TFRADynamicEmbedding-<step>/`.
  file_system/       `Variable.save_to_file_system(dir)` of the tf2_checkpoint variable and of its
                     two slot variables (raw `<name>_mht_<i>of<N>_rank0_size1-keys|-values` files).
  tf2_checkpoint_string/  like tf2_checkpoint, for `de.Variable("user/name_emb",
                     key_dtype=tf.string)`: keys with NUL bytes, non-UTF-8 bytes, the empty
                     string and long keys. expected.json holds each key as hex (`keys_hex`).
  tf2_checkpoint_string_values/  `tf.train.Checkpoint` of `de.Variable("item/tags",
                     key_dtype=tf.int64, value_dtype=tf.string, dim=3)`, 2 shards: values with NUL
                     bytes, non-UTF-8 bytes, empty strings and strings over 22 bytes.
                     expected.json holds each value as hex (`values_hex`).
  file_system_string_values/  `save_to_file_system` of that variable: what TFRA's
                     FileSystemSaver writes for string values (raw 24-byte tstring structs).
  tf2_checkpoint_dtypes/  one small table (dim 2, 2 shards) per numeric (key, value) dtype pair
                     TFRA's CPU tables accept besides int64/float32: int64 keys with float16,
                     bfloat16, float64, int8, int32, int64 values; int32 keys with float32, int32,
                     float64, bfloat16 values; the dtype's extremes included. expected.json holds
                     the values as exact JSON numbers (ints as ints).
  file_system_dtypes/<var>/  `save_to_file_system` of each of those tables, one directory each.
  fs_saver_checkpoint_float64/  `de.train.Checkpoint` of an int64 -> float64 variable made with
                     `CuckooHashTableCreator(saver=FileSystemSaver())`: the TF checkpoint holds
                     only flags, the rows (no dtype recorded) are in `TFRADynamicEmbedding-1/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DIM = 4
DEVICES = ["/CPU:0", "/CPU:0"]


def _keys(n: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    # Small, negative and large (> 2**31) ids: exercises floor-mod routing and int64 handling.
    small = rng.choice(np.arange(-50, 1000), size=n // 3, replace=False)
    large = rng.integers(2 ** 31, 2 ** 62, size=n - n // 3)
    keys = np.unique(np.concatenate([small, large]).astype(np.int64))
    rng.shuffle(keys)
    return keys


def _export_var(var, sess=None):
    """Per-shard export of a de.Variable, by TFRA itself."""
    shards = []
    for t in var.tables:
        k, v = t.export()
        if sess is not None:
            k, v = sess.run([k, v])
        else:
            k, v = k.numpy(), v.numpy()
        shards.append({"keys": [int(x) for x in k],
                       "values": [[float(y) for y in row] for row in v]})
    return shards


def _describe(var, slot_vars, sess=None, step=None):
    import tensorflow as tf
    d = {"dim": int(var.dim), "key_dtype": var.key_dtype.name, "value_dtype": var.value_dtype.name,
         "num_shards": len(var.tables), "shards": _export_var(var, sess), "slots": {}}
    for s in slot_vars:
        d["slots"][s.name.rsplit("/", 1)[-1]] = {"variable_name": s.name,
                                                  "shards": _export_var(s, sess)}
    if step is not None:
        d["step"] = int(step)
    d["tf_version"] = tf.__version__
    return d


def _write_expected(path, fmt, variables, note=""):
    import tensorflow_recommenders_addons as tfra
    import tensorflow as tf
    doc = {"written_by": "tools/tfra/make_fixtures.py", "tfra_version": tfra.__version__,
           "tf_version": tf.__version__, "format": fmt, "note": note, "variables": variables}
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")


def _fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def part_eager(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from tensorflow_recommenders_addons import dynamic_embedding as de

    tf.random.set_seed(7)
    keys = _keys(300, seed=1)
    values = np.random.default_rng(2).standard_normal((len(keys), DIM)).astype(np.float32)

    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, devices=DEVICES,
                      name="user/emb", initializer=tf_keras.initializers.RandomNormal(seed=3))
    var.upsert(tf.constant(keys), tf.constant(values))
    opt = de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(learning_rate=0.01))
    # Two steps over 48 existing ids and 16 new ids (new ids are inserted by training).
    new_ids = np.arange(5000, 5016, dtype=np.int64)
    batch = tf.constant(np.concatenate([keys[:48], new_ids]))
    target = tf.constant(np.random.default_rng(4).standard_normal((64, DIM)).astype(np.float32))
    for _ in range(2):
        with tf.GradientTape() as tape:
            emb = de.embedding_lookup(var, batch, name="lookup")
            loss = tf.reduce_sum(tf.square(emb - target))
        tw = var.get_trainable_by_name("lookup")
        grads = tape.gradient(loss, [tw])
        opt.apply_gradients(zip(grads, [tw]))
    slots = var.get_slot_variables(opt)
    step = int(opt.iterations.numpy())

    # (a) tf.train.Checkpoint (object-based, TF2).
    path = os.path.join(out, "tf2_checkpoint")
    _fresh(path)
    cwd = os.getcwd()
    os.chdir(path)
    try:
        saved = tf.train.Checkpoint(emb=var, opt=opt).save("ckpt")
    finally:
        os.chdir(cwd)
    variables = {var.name: _describe(var, slots, step=step)}
    _write_expected(path, "tf.train.Checkpoint", variables,
                    note=f"prefix {saved}; tf_keras Adam(0.01), 2 steps")

    # (b) Variable.save_to_file_system for the same variable and its slot variables.
    path = os.path.join(out, "file_system")
    _fresh(path)
    var.save_to_file_system(path)
    for s in slots:
        s.save_to_file_system(path)
    _write_expected(path, "FileSystemSaver raw files (Variable.save_to_file_system)", variables)

    # (c) Keras layer + model.fit + save_weights; (d) same with a FileSystemSaver.
    ids = np.concatenate([_keys(200, seed=5)]).reshape(-1, 2)
    y = np.random.default_rng(6).standard_normal((len(ids), 1)).astype(np.float32)
    for name, kv_creator in (("keras_save_weights", None),
                             ("keras_fs_saver",
                              de.CuckooHashTableCreator(saver=de.FileSystemSaver()))):
        kwargs = {"kv_creator": kv_creator} if kv_creator is not None else {}
        layer = de.keras.layers.Embedding(DIM, devices=DEVICES, name=f"{name}_emb",
                                          initializer=tf_keras.initializers.RandomNormal(seed=8),
                                          **kwargs)
        inp = tf_keras.Input(shape=(2,), dtype=tf.int64)
        out_t = tf_keras.layers.Dense(1)(tf_keras.layers.Flatten()(layer(inp)))
        model = tf_keras.Model(inp, out_t)
        kopt = de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.01))
        model.compile(optimizer=kopt, loss="mse")
        model.fit(ids, y, batch_size=50, epochs=1, verbose=0, shuffle=False)
        path = os.path.join(out, name)
        _fresh(path)
        os.chdir(path)
        try:
            if kv_creator is None:
                model.save_weights("weights")
                saved = "weights"
            else:
                saved = de.train.Checkpoint(model=model, optimizer=kopt).save("ckpt")
        finally:
            os.chdir(cwd)
        params = layer.params
        variables = {params.name: _describe(params, params.get_slot_variables(kopt),
                                            step=int(kopt.iterations.numpy()))}
        _write_expected(path, "keras save_weights" if kv_creator is None else
                        "de.train.Checkpoint + FileSystemSaver", variables,
                        note=f"prefix {saved}; model.fit 2 steps of 50 rows x 2 ids, tf_keras Adam")


def _string_keys(n: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    keys = [b"", b"\x00", b"a\x00", b"\x00b", b"\xff\xfe", "\u00e9".encode(), b"url/" * 50]
    keys += [b"user-%d" % i for i in rng.choice(10 ** 6, size=n - len(keys), replace=False)]
    return keys


def _export_string_var(var):
    shards = []
    for t in var.tables:
        k, v = t.export()
        shards.append({"keys_hex": [bytes(x).hex() for x in k.numpy()],
                       "values": [[float(y) for y in row] for row in v.numpy()]})
    return shards


def part_strings(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from tensorflow_recommenders_addons import dynamic_embedding as de

    tf.random.set_seed(21)
    keys = _string_keys(120, seed=22)
    values = np.random.default_rng(23).standard_normal((len(keys), DIM)).astype(np.float32)
    var = de.Variable(key_dtype=tf.string, value_dtype=tf.float32, dim=DIM, devices=DEVICES,
                      name="user/name_emb",
                      initializer=tf_keras.initializers.RandomNormal(seed=24))
    var.upsert(tf.constant(keys, tf.string), tf.constant(values))
    opt = de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(learning_rate=0.01))
    # Two steps over 30 existing keys and 6 new ones (inserted by training).
    batch = tf.constant(keys[:30] + [b"new-%d\x00" % i for i in range(6)], tf.string)
    target = tf.constant(np.random.default_rng(25).standard_normal((36, DIM)).astype(np.float32))
    for _ in range(2):
        with tf.GradientTape() as tape:
            emb = de.embedding_lookup(var, batch, name="lookup")
            loss = tf.reduce_sum(tf.square(emb - target))
        tw = var.get_trainable_by_name("lookup")
        opt.apply_gradients(zip(tape.gradient(loss, [tw]), [tw]))
    slots = var.get_slot_variables(opt)
    path = os.path.join(out, "tf2_checkpoint_string")
    _fresh(path)
    cwd = os.getcwd()
    os.chdir(path)
    try:
        saved = tf.train.Checkpoint(emb=var, opt=opt).save("ckpt")
    finally:
        os.chdir(cwd)
    d = {"dim": DIM, "key_dtype": "string", "value_dtype": "float32", "num_shards": len(DEVICES),
         "shards": _export_string_var(var), "slots": {}, "step": int(opt.iterations.numpy())}
    for s in slots:
        d["slots"][s.name.rsplit("/", 1)[-1]] = {"variable_name": s.name,
                                                  "shards": _export_string_var(s)}
    _write_expected(path, "tf.train.Checkpoint", {var.name: d},
                    note=f"prefix {saved}; string keys; tf_keras Adam(0.01), 2 steps")


def _export_exact(var):
    """Per-shard export with every value exact in JSON: ints as ints, floats (float16, bfloat16,
    float32, float64 are all exact as Python floats) as floats, strings as hex."""
    import numpy as np
    shards = []
    for t in var.tables:
        k, v = t.export()
        k, v = k.numpy(), v.numpy()
        shard = {"keys": [int(x) for x in k]}
        if var.value_dtype.name == "string":
            shard["values_hex"] = [[bytes(y).hex() for y in row] for row in v]
        elif var.value_dtype.is_integer:
            shard["values"] = [[int(y) for y in row] for row in v]
        else:
            shard["values"] = [[float(y) for y in row] for row in np.asarray(v, np.float64)]
        shards.append(shard)
    return shards


def _describe_exact(var):
    return {"dim": int(var.dim), "key_dtype": var.key_dtype.name,
            "value_dtype": var.value_dtype.name, "num_shards": len(var.tables),
            "shards": _export_exact(var), "slots": {}}


def _save_checkpoint(path, objects):
    import tensorflow as tf
    _fresh(path)
    cwd = os.getcwd()
    os.chdir(path)
    try:
        return tf.train.Checkpoint(**objects).save("ckpt")
    finally:
        os.chdir(cwd)


def part_string_values(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from tensorflow_recommenders_addons import dynamic_embedding as de

    dim = 3
    rng = np.random.default_rng(31)
    keys = np.unique(np.concatenate([np.arange(-4, 4), rng.integers(2 ** 31, 2 ** 62, 16)]))
    special = [b"", b"\x00", b"a\x00b", b"\x00\x00\x00", b"\xff\xfe\x80", "\u00e9t\u00e9".encode(),
               b"x" * 23, b"long/" * 12, b"\x00" * 30 + b"\xff", b"tag-\x00-" * 5]
    values = []
    for i in range(len(keys)):
        # Every other cell is a special value, each special appearing at least once.
        row = [special[(i * dim + j) // 2 % len(special)] if (i * dim + j) % 2 == 0
               else b"tag-%d" % int(rng.integers(10 ** 6)) for j in range(dim)]
        values.append(row)
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.string, dim=dim, devices=DEVICES,
                      name="item/tags")
    var.upsert(tf.constant(keys, tf.int64), tf.constant(values, tf.string))
    path = os.path.join(out, "tf2_checkpoint_string_values")
    saved = _save_checkpoint(path, {"tags": var})
    variables = {var.name: _describe_exact(var)}
    _write_expected(path, "tf.train.Checkpoint", variables,
                    note=f"prefix {saved}; int64 keys, string values (dim {dim})")
    path = os.path.join(out, "file_system_string_values")
    _fresh(path)
    var.save_to_file_system(path)
    _write_expected(path, "FileSystemSaver raw files (Variable.save_to_file_system)", variables,
                    note="string values are dumped as raw in-memory tstring structs")


# (key dtype, value dtype) pairs of TFRA 0.8.1's CPU tables besides int64/float32 and strings.
NUMERIC_PAIRS = [("int64", "float16"), ("int64", "bfloat16"), ("int64", "float64"),
                 ("int64", "int8"), ("int64", "int32"), ("int64", "int64"),
                 ("int32", "float32"), ("int32", "int32"), ("int32", "float64"),
                 ("int32", "bfloat16")]


def _numeric_rows(value_dtype: str, n: int, dim: int, rng):
    """n x dim values of `value_dtype`, its extremes included (as Python numbers)."""
    import numpy as np
    import tensorflow as tf
    dt = tf.as_dtype(value_dtype)
    if dt.is_integer:
        lo, hi = int(dt.min), int(dt.max)
        flat = [lo, hi, 0, -1, 1] + [int(x) for x in rng.integers(lo, hi, n * dim - 5,
                                                                  dtype=np.int64, endpoint=True)]
    else:
        tiny = float(np.finfo(np.float16).smallest_subnormal) if value_dtype == "float16" else \
            1e-30 if value_dtype == "bfloat16" else 1e-300 if value_dtype == "float64" else 1e-40
        flat = [float(dt.max), float(dt.min), -0.0, tiny, float("inf")] + \
            [float(x) for x in rng.standard_normal(n * dim - 5) * 1000]
    return [flat[i * dim:(i + 1) * dim] for i in range(n)]


def part_dtypes(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from tensorflow_recommenders_addons import dynamic_embedding as de

    dim = 2
    rng = np.random.default_rng(41)
    variables, objects, tables = {}, {}, []
    for kd, vd in NUMERIC_PAIRS:
        kmax = 2 ** 62 if kd == "int64" else 2 ** 31 - 1
        keys = np.unique(np.concatenate([[-3, -2, -1, 0, 1, 2, 3, kmax, -kmax - 1],
                                         rng.integers(-kmax, kmax, 5)])).astype(kd)
        values = _numeric_rows(vd, len(keys), dim, rng)
        var = de.Variable(key_dtype=tf.as_dtype(kd), value_dtype=tf.as_dtype(vd), dim=dim,
                          devices=DEVICES, name=f"dtypes/{kd}_{vd}")
        var.upsert(tf.constant(keys), tf.cast(tf.constant(values, tf.float64 if
                                                           vd not in ("int64",) else tf.int64),
                                              tf.as_dtype(vd)))
        variables[var.name] = _describe_exact(var)
        objects[f"t_{kd}_{vd}"] = var
        tables.append(var)
    path = os.path.join(out, "tf2_checkpoint_dtypes")
    saved = _save_checkpoint(path, objects)
    _write_expected(path, "tf.train.Checkpoint", variables,
                    note=f"prefix {saved}; one table per numeric (key, value) dtype pair")
    path = os.path.join(out, "file_system_dtypes")
    _fresh(path)
    for var in tables:
        var.save_to_file_system(os.path.join(path, var.name.replace("/", "_")))
    _write_expected(path, "FileSystemSaver raw files, one directory per variable (flat name)",
                    variables)


def part_fs_saver_dtype(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from tensorflow_recommenders_addons import dynamic_embedding as de

    dim = 2
    rng = np.random.default_rng(51)
    keys = np.unique(np.concatenate([np.arange(-3, 4), rng.integers(2 ** 31, 2 ** 62, 9)]))
    values = rng.standard_normal((len(keys), dim)) * 1000
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float64, dim=dim, devices=DEVICES,
                      name="dtypes/fs_float64",
                      kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()))
    var.upsert(tf.constant(keys), tf.constant(values, tf.float64))
    path = os.path.join(out, "fs_saver_checkpoint_float64")
    _fresh(path)
    cwd = os.getcwd()
    os.chdir(path)
    try:
        saved = de.train.Checkpoint(emb=var).save("ckpt")
    finally:
        os.chdir(cwd)
    _write_expected(path, "de.train.Checkpoint + FileSystemSaver", {var.name: _describe_exact(var)},
                    note=f"prefix {saved}; int64 keys, float64 values")


def part_v1(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from tensorflow_recommenders_addons import dynamic_embedding as de

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(11)
    keys = _keys(240, seed=12)
    values = np.random.default_rng(13).standard_normal((len(keys), DIM)).astype(np.float32)
    with tf.compat.v1.variable_scope("model"):
        var = de.get_variable("emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                              devices=DEVICES,
                              initializer=tf.compat.v1.random_normal_initializer(seed=14))
    upsert = var.upsert(tf.constant(keys), tf.constant(values))
    batch = tf.constant(np.concatenate([keys[:40], np.arange(7000, 7008, dtype=np.int64)]))
    emb, _ = de.embedding_lookup(var, batch, name="lookup", return_trainable=True)
    target = tf.constant(np.random.default_rng(15).standard_normal((48, DIM)).astype(np.float32))
    loss = tf.reduce_sum(tf.square(emb - target))
    step = tf.compat.v1.train.get_or_create_global_step()
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.01))
    train = opt.minimize(loss, global_step=step)
    saver = tf.compat.v1.train.Saver()
    path = os.path.join(out, "v1_saver")
    _fresh(path)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(upsert)
        sess.run(train)
        sess.run(train)
        cwd = os.getcwd()
        os.chdir(path)
        try:
            saved = saver.save(sess, "model", global_step=step, write_meta_graph=False)
        finally:
            os.chdir(cwd)
        slots = var.get_slot_variables(opt)
        variables = {var.name: _describe(var, slots, sess=sess, step=sess.run(step))}
    _write_expected(path, "tf.compat.v1.train.Saver", variables,
                    note=f"prefix {saved}; TF1 AdamOptimizer(0.01), 2 steps")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "fixtures", "tfra"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--part", choices=("all", "eager", "v1", "strings", "string_values",
                                          "dtypes", "fs_saver_dtype"), default="all")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if args.part == "all":
        # Graph mode is process-global in TF, so each part runs in its own process.
        for part in ("eager", "v1", "strings", "string_values", "dtypes", "fs_saver_dtype"):
            subprocess.run([sys.executable, os.path.abspath(__file__), "--out", out,
                            "--part", part], check=True)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        print(f"fixtures in {out}: {total / 1024:.1f} KiB")
    elif args.part == "eager":
        part_eager(out)
    elif args.part == "strings":
        part_strings(out)
    elif args.part == "string_values":
        part_string_values(out)
    elif args.part == "dtypes":
        part_dtypes(out)
    elif args.part == "fs_saver_dtype":
        part_fs_saver_dtype(out)
    else:
        part_v1(out)


if __name__ == "__main__":
    main()
