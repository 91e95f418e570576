"""Progress lines where no bar draws: a loop's count and ETA about once a minute, also while
an item is awaited; end to end (pretraining and fine-tuning in a run whose stderr is a pipe)
in tests/test_pipeline.py."""

from __future__ import annotations

import logging
import re
import time

from components.core import progress


def test_a_loop_without_a_terminal_logs_its_count_and_eta_while_it_waits(monkeypatch, caplog):
    monkeypatch.setenv("BERTFLOW_PROGRESS_SECONDS", "0.1")
    monkeypatch.delenv("BERTFLOW_PROGRESS", raising=False)
    assert not progress.enabled()  # pytest's stderr is no terminal: lines, not a bar

    def slow(n: int):
        for i in range(n):
            time.sleep(0.35)  # an item awaited longer than the interval: lines come meanwhile
            yield i

    with caplog.at_level(logging.INFO, logger="components.core.progress"):
        assert list(progress.bar(slow(3), "fits of x", total=3, unit="fit")) == [0, 1, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("progress: fits of x: ") for line in lines)
    assert "0/3 fit, " in lines[0] and lines[0].endswith("ETA ?")  # nothing done: no estimate
    assert any(re.search(r": [12]/3 fit, \d+ s elapsed, ETA \d+ s$", line) for line in lines)
    time.sleep(0.3)  # the loop is over: its thread has stopped
    assert len(caplog.records) == len(lines)


def test_no_lines_when_progress_is_off(monkeypatch, caplog):
    monkeypatch.setenv("BERTFLOW_PROGRESS", "0")
    items = [1, 2]
    assert progress.bar(items, "x") is items and progress.line_seconds() is None


def test_durations_read_as_a_log_gives_them():
    assert [progress.duration(s) for s in (42, 150, 7260)] == ["42 s", "2.5 min", "2 h 01 min"]
    assert progress.eta(60, 1, 4) == "ETA 3.0 min" and progress.eta(60, 0, 4) == "ETA ?"
