"""Checkpoint paths: URL schemes other than file:// are refused with an error naming the scheme,
never turned into a local directory such as ./gs:/bucket/ckpt; file:// URLs work."""

import os

import numpy as np
import pytest

from dualemb.core import Table, checkpoint

REMOTE = ["gs://bucket/ckpt", "s3://bucket/ckpt", "hdfs://namenode/ckpt", "GS://bucket/ckpt"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _table():
    t = Table(dim=3)
    t.insert_or_assign(np.arange(5, dtype=np.int64), np.arange(15, dtype=np.float32).reshape(5, 3))
    return t


@pytest.mark.parametrize("url", REMOTE)
def test_core_save_and_load_refuse_remote_schemes(in_tmp, url):
    t = _table()
    scheme = url.split("://")[0].lower()
    with pytest.raises(ValueError, match=f"'{scheme}://'"):
        checkpoint.save(url, {"t": t})
    with pytest.raises(ValueError, match=f"'{scheme}://'"):
        checkpoint.load(url, {"t": t})
    assert os.listdir(in_tmp) == []  # nothing written locally
    assert t.size() == 5


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


def test_jax_save_refuses_remote_scheme(in_tmp):
    dej = pytest.importorskip("dualemb.jax")
    table = dej.create(3)
    with pytest.raises(ValueError, match="'gs://'"):
        dej.save({"t": table}, "gs://bucket/ckpt")
    assert os.listdir(in_tmp) == []


def test_tf_save_refuses_remote_scheme(in_tmp):
    de = pytest.importorskip("dualemb.tf")
    import keras
    emb = de.keras.layers.Embedding(3, name="emb")
    model = keras.Sequential([keras.Input((2,), dtype="int64"), emb])
    model(np.array([[1, 2]], np.int64))
    with pytest.raises(ValueError, match="'gs://'"):
        de.save(model, "gs://bucket/ckpt")
    assert os.listdir(in_tmp) == []
