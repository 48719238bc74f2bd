"""Checkpoint paths: a URL whose scheme no installed file system serves is refused with an error
naming the scheme, never turned into a local directory such as ./nosuch:/bucket/ckpt; file://
URLs are local paths; object-store URLs (fsspec) need fsspec only when used. The object stores
themselves are tested in test_checkpoint_object_store.py."""

import os
import sys

import numpy as np
import pytest

from dualemb.core import Table, checkpoint

UNKNOWN = ["nosuchscheme://bucket/ckpt", "NoSuchScheme://bucket/ckpt"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _table():
    t = Table(dim=3)
    t.insert_or_assign(np.arange(5, dtype=np.int64), np.arange(15, dtype=np.float32).reshape(5, 3))
    return t


@pytest.mark.parametrize("url", UNKNOWN)
def test_core_save_and_load_refuse_unknown_schemes(in_tmp, url):
    pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not installed")
    t = _table()
    with pytest.raises(ValueError, match="'nosuchscheme://'"):
        checkpoint.save(url, {"t": t})
    with pytest.raises(ValueError, match="'nosuchscheme://'"):
        checkpoint.load(url, {"t": t})
    assert os.listdir(in_tmp) == []  # nothing written locally
    assert t.size() == 5


def test_without_fsspec_urls_name_the_extra_and_local_paths_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # `import fsspec` raises ImportError
    t = _table()
    with pytest.raises(ValueError, match=r"'gs://'.*fsspec.*dualemb\[object-store\]"):
        checkpoint.save("gs://bucket/ckpt", {"t": t})
    checkpoint.save(tmp_path / "ck", {"t": t})
    u = Table(dim=3)
    checkpoint.load(tmp_path / "ck", {"t": u})
    keys = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(u.find(keys)[0], t.find(keys)[0])


def test_file_url_is_a_local_path(tmp_path):
    t = _table()
    url = "file://" + str(tmp_path / "ckpt")
    checkpoint.save(url, {"t": t})
    assert os.path.isfile(tmp_path / "ckpt" / "manifest.json")
    u = Table(dim=3)
    checkpoint.load(url, {"t": u})
    keys = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(u.find(keys)[0], np.arange(15, dtype=np.float32).reshape(5, 3))
    assert u.find(keys)[1].all()


def test_relative_file_url_is_refused(in_tmp):
    with pytest.raises(ValueError, match="absolute"):
        checkpoint.save("file://ckpt", {"t": _table()})


def test_jax_save_refuses_unknown_scheme(in_tmp):
    pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not installed")
    dej = pytest.importorskip("dualemb.jax")
    table = dej.create(3)
    with pytest.raises(ValueError, match="'nosuchscheme://'"):
        dej.save({"t": table}, "nosuchscheme://bucket/ckpt")
    assert os.listdir(in_tmp) == []


def test_tf_save_refuses_unknown_scheme(in_tmp):
    pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not installed")
    de = pytest.importorskip("dualemb.tf")
    import keras
    emb = de.keras.layers.Embedding(3, name="emb")
    model = keras.Sequential([keras.Input((2,), dtype="int64"), emb])
    model(np.array([[1, 2]], np.int64))
    with pytest.raises(ValueError, match="'nosuchscheme://'"):
        de.save(model, "nosuchscheme://bucket/ckpt")
    assert os.listdir(in_tmp) == []


class _UrlPath:
    """An os.PathLike naming a URL, as etils.epath.Path("gs://...") is."""

    def __init__(self, text):
        self.text = text

    def __fspath__(self):
        return self.text


def test_fsspec_url_as_pathlike_and_any_case_scheme_is_one_checkpoint(in_tmp):
    fsspec = pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not "
                                                  "installed")
    t = _table()
    checkpoint.save(_UrlPath("MEMORY://dualemb-paths-test/ck/"), {"t": t}, steps=4)
    try:
        ck = checkpoint.load("memory://dualemb-paths-test/ck")
        assert ck.steps == {"t": 4}
        keys = np.arange(5, dtype=np.int64)
        np.testing.assert_array_equal(ck.tables["t"].find(keys)[0], t.find(keys)[0])
        assert os.listdir(in_tmp) == []  # nothing written locally
    finally:
        fsspec.filesystem("memory").rm("/dualemb-paths-test", recursive=True)


def test_file_writer_refuses_a_url_instead_of_writing_it_locally(in_tmp):
    from dualemb.core.checkpoint._safetensors import Writer
    with pytest.raises(ValueError, match="Staging.new_file"):
        Writer("gs://bucket/ck/table-0000-shard-00000.safetensors",
               [("keys", np.int64, (2,))])
    assert os.listdir(in_tmp) == []
