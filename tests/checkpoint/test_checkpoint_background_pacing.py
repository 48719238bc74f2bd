"""The background writer paces itself (DUALEMB_BACKGROUND_SAVE_DUTY: the fraction of time it
works): after each page it pauses (1 - duty) / duty times as long as the page took; a cancel and
a second save end the pauses, wait() keeps them; a bad setting is refused before anything is
copied; the checkpoint is the state of the call (numpy reference) whatever the duty."""

import os
import time

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _background, _write
from background_saves import no_save_left_running  # noqa: F401 (autouse fixture)
from table_rows import assert_same, snapshot  # tests/ helper

PAGE_S = 0.02  # what each page export takes at least here (slowed down on purpose)


def _trained(rows=600):
    t = Table(4, optimizer="adam")
    t.apply_gradients(np.arange(rows), np.full((rows, 4), 0.5, np.float32), 0.1, 1)
    return t


@pytest.fixture
def slow_pages(monkeypatch):
    """Every page export takes PAGE_S longer; returns the list of the pauses the pacer asks for."""
    real = _write._export_page

    def export_page(table, offset, limit):
        time.sleep(PAGE_S)
        return real(table, offset, limit)

    monkeypatch.setattr(_write, "_export_page", export_page)
    pauses = []

    class RecordedWake:
        def __init__(self, wake):
            self._wake = wake

        def is_set(self):
            return self._wake.is_set()

        def wait(self, timeout):
            pauses.append(timeout)
            return self._wake.wait(timeout)

    class Recording(_background._Pacer):
        def __init__(self, duty, wake):
            super().__init__(duty, RecordedWake(wake))

    monkeypatch.setattr(_background, "_Pacer", Recording)
    return pauses


def test_default_duty(monkeypatch):
    monkeypatch.delenv(_background.DUTY_ENV, raising=False)
    assert _background.writer_duty() == _background.WRITER_DUTY
    monkeypatch.setenv(_background.DUTY_ENV, " 0.25 ")
    assert _background.writer_duty() == 0.25


@pytest.mark.parametrize("duty", ["0.25", "1"])
def test_the_writer_pauses_after_each_page(tmp_path, monkeypatch, slow_pages, duty):
    monkeypatch.setenv(_background.DUTY_ENV, duty)
    t = _trained()
    before = snapshot(t)
    h = checkpoint.save(str(tmp_path / "c"), {"t": t}, steps=1, page_rows=100, blocking=False)
    t.apply_gradients(np.arange(600), np.ones((600, 4), np.float32), 0.1, 2)  # after the call
    deadline = time.monotonic() + 60
    while not h.done() and time.monotonic() < deadline:  # looks only: a wait() would hurry it
        time.sleep(0.01)
    h.wait(0)
    assert_same(snapshot(checkpoint.load(str(tmp_path / "c")).tables["t"]), before)
    if duty == "1":
        assert slow_pages == []  # no pauses at all
        return
    # 6 pages: a pause before each but the first, 3 times the page's time (>= PAGE_S) each
    assert len(slow_pages) == 5
    assert min(slow_pages) >= 3 * PAGE_S


def test_cancel_ends_a_pause_at_once(tmp_path, monkeypatch, slow_pages):
    monkeypatch.setenv(_background.DUTY_ENV, "0.0001")  # pauses of >= 200 s after a page
    t = _trained()
    path = str(tmp_path / "c")
    checkpoint.save(path, {"t": t}, steps=1)
    before = snapshot(checkpoint.load(path).tables["t"])
    t.apply_gradients(np.arange(600), np.ones((600, 4), np.float32), 0.1, 2)
    h = checkpoint.save(path, {"t": t}, steps=2, page_rows=100, blocking=False)
    deadline = time.monotonic() + 30
    while not slow_pages and time.monotonic() < deadline:  # the writer is in its first pause
        time.sleep(0.01)
    assert slow_pages and min(slow_pages) >= 9999 * PAGE_S
    assert h.cancel()
    with pytest.raises(checkpoint.SaveCancelled):
        h.wait(30)  # far less than the pause
    assert_same(snapshot(checkpoint.load(path).tables["t"]), before)
    assert os.listdir(tmp_path) == ["c"]


@pytest.mark.parametrize("bad", ["0", "-0.5", "1.5", "nan", "inf", "half"])
def test_a_bad_setting_is_refused_before_anything_is_copied(tmp_path, monkeypatch, bad):
    monkeypatch.setenv(_background.DUTY_ENV, bad)
    copied = []
    real = _background.snapshot_tables
    monkeypatch.setattr(_background, "snapshot_tables", lambda tables: copied.append(1) or
                        real(tables))
    t = _trained()
    before = snapshot(t)
    with pytest.raises(ValueError, match=_background.DUTY_ENV):
        checkpoint.save(str(tmp_path / "c"), {"t": t}, steps=1, blocking=False)
    assert copied == []
    assert not os.path.exists(tmp_path / "c")
    assert_same(snapshot(t), before)


def _in_a_long_pause(monkeypatch, slow_pages, tmp_path, name="c"):
    """A background save of a trained table, its writer in a pause of >= 200 s after page 1."""
    monkeypatch.setenv(_background.DUTY_ENV, "0.0001")
    t = _trained()
    before = snapshot(t)
    h = checkpoint.save(str(tmp_path / name), {"t": t}, steps=1, page_rows=100, blocking=False)
    t.apply_gradients(np.arange(600), np.ones((600, 4), np.float32), 0.1, 2)  # after the call
    deadline = time.monotonic() + 30
    while not slow_pages and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow_pages and min(slow_pages) >= 9999 * PAGE_S
    return t, h, before


def test_waiting_keeps_the_pace(tmp_path, monkeypatch, slow_pages):
    _, h, _ = _in_a_long_pause(monkeypatch, slow_pages, tmp_path)
    with pytest.raises(TimeoutError):
        h.wait(0.3)  # a thread waiting beside training (Orbax's commit) leaves the pauses be
    with pytest.raises(TimeoutError):
        h.exception(0)
    assert not h.done() and len(slow_pages) == 1
    assert h.cancel()  # ends the pause at once
    with pytest.raises(checkpoint.SaveCancelled):
        h.wait(30)


def test_a_second_save_ends_the_pauses_of_the_first(tmp_path, monkeypatch, slow_pages):
    t, h, before = _in_a_long_pause(monkeypatch, slow_pages, tmp_path)
    after = snapshot(t)
    checkpoint.save(str(tmp_path / "d"), {"t": t}, steps=2)  # waits for the first, not 1000 s
    assert h.done() and h.exception() is None
    assert_same(snapshot(checkpoint.load(str(tmp_path / "c")).tables["t"]), before)
    assert_same(snapshot(checkpoint.load(str(tmp_path / "d")).tables["t"]), after)
