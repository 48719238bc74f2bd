"""Checkpoints on object stores (docs/checkpoint_format.md §6, "On an object store"), against
real local servers started on 127.0.0.1: moto's S3 server (s3://) and gcp-storage-emulator
(gs://). Each is checked against a local save of the same tables, file by file, bit for bit, and
against the tables it was saved from (rows, slots, steps, and training continued after the
load). A server killed mid-save leaves nothing visible and the previous checkpoint loadable."""

import json
import os
import types

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _object_store, _write
from table_rows import assert_same, snapshot  # tests/ helper

import _object_store_servers as servers

fsspec = pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not installed")

# gcsfs >= 2026 asks a gRPC control plane for every bucket's layout, which an emulator does not
# serve (each lookup times out after a minute); the plain JSON API is what the emulator speaks.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

ADAM = {"name": "adam", "flavor": "keras"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with servers.s3_bucket(str(tmp_path_factory.mktemp("moto"))) as url:
        yield url


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("gcs"))
    box = {"server": servers.gcs_emulator(data_dir)}
    old = {p: fsspec.config.conf.get(p) for p in ("gs", "gcs")}
    try:
        for p in ("gs", "gcs"):
            fsspec.config.conf[p] = servers.gcs_options(box["server"])

        def restart():  # same port and storage directory: what was written survives
            box["server"].kill()
            box["server"] = servers.gcs_emulator(data_dir, port=box["server"].port)

        yield types.SimpleNamespace(url="gs://bucket", server=lambda: box["server"],
                                    restart=restart)
    finally:
        box["server"].kill()
        for p, v in old.items():
            fsspec.config.conf.pop(p, None)
            if v is not None:
                fsspec.config.conf[p] = v


@pytest.fixture(params=["s3", "gcs"])
def store(request):
    """The base URL of a bucket on each server."""
    fx = request.getfixturevalue(request.param)
    return fx if isinstance(fx, str) else fx.url


# ---- helpers -------------------------------------------------------------------------------------


def make_tables(seed=0):
    """"user": one table with Keras Adam, trained twice (non-zero slots); "item": two shards
    without optimizer."""
    rng = np.random.default_rng(seed)
    user = Table(dim=8, optimizer=ADAM)
    ukeys = rng.choice(10_000, 300, replace=False).astype(np.int64)
    user.insert_or_assign(ukeys, rng.standard_normal((300, 8)).astype(np.float32))
    for step in (1, 2):
        user.apply_gradients(ukeys[:200], rng.standard_normal((200, 8)).astype(np.float32),
                             0.01, step)
    item = [Table(dim=4), Table(dim=4)]
    ikeys = rng.choice(10_000, 200, replace=False).astype(np.int64)
    for j, t in enumerate(item):
        k = ikeys[ikeys % 2 == j]
        t.insert_or_assign(k, rng.standard_normal((len(k), 4)).astype(np.float32))
    return {"user": user, "item": item}, ukeys


def remote_files(url) -> dict:
    """name -> bytes of every object of the generation that url's commit marker names."""
    fs, p = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    gen = json.loads(fs.cat_file(f"{p}/{_object_store.COMMIT}"))["generation"]
    return {name.rsplit("/", 1)[-1]: fs.cat_file(name) for name in fs.find(f"{p}/{gen}")}


def local_files(path) -> dict:
    return {n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path)}


def without_time(manifest_bytes: bytes) -> dict:
    m = json.loads(manifest_bytes)
    m.pop("created_unix")
    return m


def assert_same_files(remote: dict, local: dict):
    assert sorted(remote) == sorted(local)
    for name in local:
        if name in ("manifest.json", "manifest.crc32.json"):
            continue  # they differ only in created_unix (and so in its checksum)
        assert remote[name] == local[name], name
    assert without_time(remote["manifest.json"]) == without_time(local["manifest.json"])


def prefixes(url) -> list:
    fs, p = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False))


# ---- core tables ---------------------------------------------------------------------------------
def test_core_round_trip_equals_local_save(store, tmp_path):
    tables, ukeys = make_tables()
    dense = {"mlp/w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    url = f"{store}/core/ck"
    # page_rows=64: several pages per shard, streamed through the spool file
    checkpoint.save(url, tables, steps={"user": 2, "item": None}, dense=dense, page_rows=64)
    checkpoint.save(tmp_path / "local", tables, steps={"user": 2, "item": None}, dense=dense,
                    page_rows=64)
    assert_same_files(remote_files(url), local_files(tmp_path / "local"))

    user, items = Table(dim=8), [Table(dim=4) for _ in range(3)]  # resharded 2 -> 3 on load
    ck = checkpoint.load(url, {"user": user, "item": items})
    assert ck.steps == {"user": 2, "item": None}
    np.testing.assert_array_equal(ck.dense["mlp/w"], dense["mlp/w"])
    assert user.optimizer == tables["user"].optimizer
    assert_same(snapshot(user), snapshot(tables["user"]))
    assert_same(snapshot(items), snapshot(tables["item"]))

    # training continues exactly as it would have without the save
    g = np.random.default_rng(5).standard_normal((300, 8)).astype(np.float32)
    tables["user"].apply_gradients(ukeys, g, 0.01, 3)
    user.apply_gradients(ukeys, g, 0.01, 3)
    trained, want = snapshot(user), snapshot(tables["user"])
    for k in ("keys", "values", "slots", "update_count"):  # last_update: another table's clock
        np.testing.assert_array_equal(trained[k], want[k], err_msg=k)

    # a second save replaces the first: one generation, named by the marker; the new rows load
    first = prefixes(url)
    checkpoint.save(url, {"user": tables["user"]}, steps=3)
    after = prefixes(url)
    assert len(after) == 2 and _object_store.COMMIT in after and not set(first) & (set(after) -
                                                                                  {"commit.json"})
    again = checkpoint.load(url)
    assert list(again.tables) == ["user"] and again.steps == {"user": 3}
    assert_same(snapshot(again.tables["user"]), snapshot(tables["user"]))


def test_uncommitted_generation_is_invisible_and_removed_by_the_next_save(store):
    url = f"{store}/stale/ck"
    tables, _ = make_tables(seed=1)
    checkpoint.save(url, {"user": tables["user"]}, steps=7)
    before = snapshot(checkpoint.load(url).tables["user"])
    fs, p = fsspec.core.url_to_fs(url)
    # A dead save of another process on this host (pid 2**22 + 1 does not exist: above the
    # kernel's pid_max) that got as far as writing its manifest, but not the marker.
    dead = f"gen-{_object_store._objects.host()}-{2 ** 22 + 1}-{12345:016x}"
    committed = json.loads(fs.cat_file(f"{p}/commit.json"))["generation"]
    for name in ("table-0000-shard-00000.safetensors", "manifest.crc32.json", "manifest.json"):
        fs.pipe_file(f"{p}/{dead}/{name}", fs.cat_file(f"{p}/{committed}/{name}"))
    assert dead in prefixes(url)
    ck = checkpoint.load(url)  # the marker's generation, not the newer-looking dead one
    assert ck.path.endswith(committed) and ck.steps == {"user": 7}
    assert_same(snapshot(ck.tables["user"]), before)

    checkpoint.save(url, {"user": tables["user"]}, steps=8)
    left = prefixes(url)
    assert dead not in left and committed not in left and len(left) == 2


def test_a_dead_process_spool_is_removed_by_the_next_save(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(_object_store.tempfile, "tempdir", None)  # re-read TMPDIR
    dead = tmp_path / f"{_object_store.SPOOL_PREFIX}{2 ** 22 + 1}-abc"  # no such pid
    dead.mkdir()
    (dead / "table-0000-shard-00000.safetensors").write_bytes(b"x" * 100)
    mine = tmp_path / f"{_object_store.SPOOL_PREFIX}{os.getpid()}-abc"  # a live process's
    mine.mkdir()
    checkpoint.save(f"{s3}/spool/ck", {"user": make_tables()[0]["user"]})
    assert sorted(os.listdir(tmp_path)) == [mine.name]  # and the save's own spool is gone


def test_prefix_without_marker_is_not_a_checkpoint(store):
    url = f"{store}/nomarker/ck"
    fs, p = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{p}/gen-host-1-{1:016x}/table-0000-shard-00000.safetensors", b"x" * 64)
    with pytest.raises(FileNotFoundError):
        checkpoint.load(url)
    with pytest.raises(FileNotFoundError):
        checkpoint.read_manifest(url)


def test_refuses_to_write_over_foreign_objects(s3):
    url = f"{s3}/foreign/ck"
    fs, p = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{p}/notes.txt", b"mine")
    with pytest.raises(checkpoint.CheckpointError, match="notes.txt"):
        checkpoint.save(url, {"user": make_tables()[0]["user"]})
    assert fs.cat_file(f"{p}/notes.txt") == b"mine" and prefixes(url) == ["notes.txt"]


# ---- several writers (the multi-process protocol; here threads) ---------------------------------
def test_several_writers_make_one_checkpoint(s3, tmp_path):
    from test_checkpoint_parts import assert_rows, contents, run_writers, shard_tables
    tables, want = shard_tables(3)
    parts = [{"t": [(k, t)]} for k, t in enumerate(tables)]
    url = f"{s3}/parts/ck"
    # writer 1 coordinates: the others find its generation by listing the bucket
    assert run_writers(url, parts, coordinator=1, steps=5) == [None] * 3
    assert run_writers(tmp_path / "local", parts, coordinator=1, steps=5) == [None] * 3
    assert_same_files(remote_files(url), local_files(tmp_path / "local"))
    ck = checkpoint.load(url, num_shards=1)
    assert ck.steps == {"t": 5}
    assert_rows(contents([ck.tables["t"][0]]), want)


# ---- a server killed mid-save --------------------------------------------------------------------
def test_server_killed_mid_save_keeps_the_previous_checkpoint(gcs, monkeypatch):
    import gcsfs.retry
    url = f"{gcs.url}/killed/ck"
    tables, _ = make_tables(seed=2)
    checkpoint.save(url, tables, steps=1)
    before = {n: snapshot(t) for n, t in tables.items()}
    files_before = remote_files(url)

    # The second save: "user" is uploaded, then the server dies while "item" is exported.
    for t in tables["item"]:
        t.insert_or_assign(np.array([10**6 + t.size()], np.int64), np.ones((1, 4), np.float32))
    real = _write._export_page

    def export_then_kill(table, offset, limit):
        if table.dim == 4:
            gcs.server().kill()
        return real(table, offset, limit)

    monkeypatch.setattr(_write, "_export_page", export_then_kill)
    # gcsfs retries a refused connection 6 times with back-off (about 30 s); not what is tested
    fast = types.SimpleNamespace(**{k: getattr(gcsfs.retry.asyncio, k)
                                    for k in dir(gcsfs.retry.asyncio) if not k.startswith("__")})

    async def no_wait(_):
        return None

    fast.sleep = no_wait
    monkeypatch.setattr(gcsfs.retry, "asyncio", fast)
    with pytest.raises(Exception, match="[Cc]onnect"), \
            pytest.warns(RuntimeWarning, match="the next save removes them"):
        checkpoint.save(url, tables, steps=2)  # and its clean-up cannot reach the server either
    monkeypatch.setattr(_write, "_export_page", real)
    gcs.restart()

    # What the dead save wrote is there, unpublished: the marker still names the first save.
    left = prefixes(url)
    assert len(left) == 3, left  # commit.json, the first save, the dead save's generation
    assert remote_files(url) == files_before
    ck = checkpoint.load(url)
    assert ck.steps == {"user": 1, "item": 1}
    for name in tables:
        assert_same(snapshot(ck.tables[name]), before[name])

    # The next save removes the dead save's generation (and the first, once replaced).
    checkpoint.save(url, tables, steps=3)
    assert len(prefixes(url)) == 2
    ck = checkpoint.load(url, names=["item"])
    assert_same(snapshot(ck.tables["item"]), snapshot(tables["item"]))


# ---- the front ends ------------------------------------------------------------------------------
def test_jax_save_load_continue(s3, tmp_path):
    jax = pytest.importorskip("jax")
    dej = pytest.importorskip("dualemb.jax")
    t = dej.create(4, initializer=dej.initializers.normal(0.0, 1.0, seed=3),
                   optimizer=dej.optimizers.adam(0.05))
    ids = dej.ids(np.arange(60, dtype=np.int64) * 3)
    g = np.random.default_rng(0).standard_normal((60, 4)).astype(np.float32)
    step = jax.jit(dej.apply_gradients)
    t = step(t, ids, g)
    url = f"{s3}/jax/ck"
    dej.save({"emb": t}, url)
    dej.save({"emb": t}, tmp_path / "local")
    assert_same_files(remote_files(url), local_files(tmp_path / "local"))

    u = dej.load(url, "emb")
    assert int(np.asarray(u.step)) == int(np.asarray(t.step)) == 1
    assert_same(snapshot(u.core()), snapshot(t.core()))
    t, u = step(t, ids, g), step(u, ids, g)
    np.testing.assert_array_equal(np.asarray(dej.lookup(u, ids)), np.asarray(dej.lookup(t, ids)))
    trained, want = snapshot(u.core()), snapshot(t.core())
    for k in ("keys", "values", "slots", "update_count"):  # last_update: another table's clock
        np.testing.assert_array_equal(trained[k], want[k], err_msg=k)


def test_tf_save_load(gcs, tmp_path):
    tf = pytest.importorskip("tensorflow")
    de = pytest.importorskip("dualemb.tf")
    var = de.Variable(key_dtype=tf.int64, dim=4, devices=["/CPU:0"] * 2, name="objstore_tf")
    keys = tf.constant(np.arange(0, 90, 3, dtype=np.int64))
    rows = np.random.default_rng(1).standard_normal((30, 4)).astype(np.float32)
    var.upsert(keys, tf.constant(rows))
    url = f"{gcs.url}/tf/ck"
    de.save(var, url)
    de.save(var, tmp_path / "local")
    assert_same_files(remote_files(url), local_files(tmp_path / "local"))

    var.upsert(keys, tf.zeros((30, 4)))  # changed after the save; the load restores it
    var.upsert(tf.constant([1000], tf.int64), tf.ones((1, 4)))
    de.load(var, url)
    np.testing.assert_array_equal(var.lookup(keys).numpy(), rows)
    assert int(var.size()) == 30
