"""A run that differs from the committed reference says which outputs differ and which facts of
the machine differ (pipeline.drift), in `bertflow metrics`."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from components.core.machine import cpu_facts
from pipeline.cli import main
from pipeline.drift import drift
from tests.conftest import run_cli, small_params, write_params


def _lock(encoder_md5: str) -> str:
    return yaml.safe_dump({"schema": "2.0", "stages": {
        "tokenizer": {"cmd": "bertflow stage tokenizer",
                      "outs": [{"path": "data/tokenizer", "md5": "a1.dir"}]},
        "pretrain": {"cmd": "bertflow stage pretrain", "outs": [{"path": "data/models/encoder",
                                                                 "md5": encoder_md5}]}}})


def test_metrics_names_the_outputs_and_the_machine_facts_that_differ_from_the_reference(
        tmp_path, monkeypatch, capsys):
    here = cpu_facts()
    reference = {**here, "cpu_id": "cpu family 6 model 106 stepping 6", "cpu_flags": "avx2 fma avx512f"}
    params = write_params(tmp_path, small_params())
    (tmp_path / "metrics").mkdir()
    (tmp_path / "dvc.lock").write_text(_lock("e1.dir"))
    (tmp_path / "metrics" / "pretrain_stats.json").write_text(json.dumps({"machine": reference}))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "reference"]):
        run_cli(*cmd, cwd=tmp_path)
    assert drift(tmp_path, tmp_path / "metrics") == []  # the checkout is the reference

    # This machine's run: the same tokenizer, another encoder.
    (tmp_path / "dvc.lock").write_text(_lock("e2.dir"))
    (tmp_path / "metrics" / "pretrain_stats.json").write_text(json.dumps({"machine": here}))
    monkeypatch.setattr(sys, "argv", ["bertflow", "metrics", "-p", str(params)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert "differs from the committed reference (git HEAD): 1 of 2 outputs: data/models/encoder" in out
    (facts,) = [line for line in out if "machine facts" in line]
    assert f"cpu_id: cpu family 6 model 106 stepping 6 -> {here['cpu_id']}" in facts
    assert f"cpu_flags: avx2 fma avx512f -> {here['cpu_flags']}" in facts
    assert "threads" not in facts  # only what differs


def test_the_facts_name_the_kernels_in_use():
    facts = cpu_facts()
    assert facts["aten_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "NEON", "SVE256")
    assert facts["threads"] >= 1 and facts["torch"].startswith("2.13")
