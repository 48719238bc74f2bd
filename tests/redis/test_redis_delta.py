"""A Redis-backed table does not track changed rows: a full save works (and loads), a delta save
on it is refused naming the reason, and nothing is written."""
import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from redis_server import running_server

server = pytest.fixture(running_server)


def test_delta_save_of_a_redis_table_is_refused(server, tmp_path):
    red = Table(dim=2, backend={"redis": {"name": "delta-refused",
                                          "addresses": [server.address]}})
    red.insert_or_assign(np.arange(5), np.ones((5, 2), np.float32))
    checkpoint.save(tmp_path / "full", {"emb": red})
    mem = checkpoint.load(tmp_path / "full").tables["emb"]
    assert sorted(mem.export()["keys"].tolist()) == list(range(5))
    red.insert_or_assign(np.array([9]), np.ones((1, 2), np.float32))
    with pytest.raises(CheckpointError, match="does not track which rows changed"):
        checkpoint.save(tmp_path / "d", {"emb": red}, base=tmp_path / "full")
    assert not (tmp_path / "d").exists()
    red.clear()
