"""The `bertflow` command: light start-up, one clear line and a non-zero exit on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import BIN, ROOT, run_cli, small_params, write_params


def test_help_does_not_import_heavy_libraries():
    # The real entry point (pipeline.cli:main, which also sets the environment defaults).
    code = "import sys; sys.argv = ['bertflow', '--help']; from pipeline.cli import main; main()"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0
    assert "Usage: bertflow" in proc.stdout and "│ run " in proc.stdout and "│ stage " in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    heavy = {"torch", "lightning", "mlflow", "prefect", "great_expectations", "dvc", "transformers"}
    assert not heavy & imported


def test_every_option_shows_its_help_and_default_whole():
    # Help text goes through rich markup: `[default: ...]` written into it vanished from
    # `predict --help`. Defaults are typer's show_default, never written into the help.
    import typer.main

    from pipeline.cli import app

    def commands(group):
        for name, command in getattr(group, "commands", {}).items():
            yield name, command
            yield from commands(command)

    for name, command in commands(typer.main.get_command(app)):
        for param in command.params:
            assert "[default" not in (getattr(param, "help", None) or ""), f"{name} {param.name}"
    proc = run_cli("bertflow", "predict", "--help", cwd=ROOT, env={"COLUMNS": "200"})
    assert "[default: (models:/TASK@champion)]" in proc.stdout


def test_unknown_stage_for_until_is_refused_before_prefect_starts(tmp_path):
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    proc = run_cli("bertflow", "run", "--until", "bogus", "-p", str(params), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: unknown stage 'bogus' (stages: ingest, clean, checkpoint, "
                                   "tokenizer, pairs, pretrain, task_data, adapt, teacher, transfer_set, "
                                   "finetune, distill, evaluate, transfer)")
    proc = run_cli("bertflow", "run", "--until", "finetune@nope", "-p", str(params), cwd=tmp_path,
                   check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: unknown task 'nope' (tasks: movie-sentiment, trec-6,")
    assert not (tmp_path / "mlflow.db").exists()  # nothing started, nothing recorded


def test_bad_jsonl_row_is_one_clear_line_and_nothing_is_written(tmp_path):
    (tmp_path / "data" / "user").mkdir(parents=True)
    (tmp_path / "data" / "user" / "docs.jsonl").write_text(
        json.dumps({"text": "Fine. Also fine."}) + "\n{broken\n")
    params = write_params(tmp_path, small_params(
        ingest={"sources": [{"name": "mine", "kind": "jsonl", "path": "data/user/docs.jsonl"}]},
        tracking={"uri": "sqlite:///mlflow.db"}))
    proc = run_cli("bertflow", "stage", "ingest", "--params", str(params), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "error: " in proc.stderr and "docs.jsonl:2: not a valid JSON line" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "raw").exists()
    assert not (tmp_path / "metrics").exists()


@pytest.mark.slow
def test_corpus_with_binary_non_utf8_and_empty_files_is_ingested_with_counted_drops(tmp_path):
    corpus = tmp_path / "data" / "user" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "a.txt").write_text("A first document. It has sentences.")
    (corpus / "b.txt").write_bytes("Déjà vu. Encore une fois.".encode("cp1252"))
    (corpus / "c.txt").write_bytes(b"")
    (corpus / "d.txt").write_bytes(bytes(range(256)) * 4)
    params = write_params(tmp_path, small_params(
        ingest={"sources": [{"name": "mine", "kind": "txt_dir", "path": "data/user/corpus"}]},
        tracking={"uri": "sqlite:///mlflow.db"}))
    run_cli("bertflow", "stage", "ingest", "--params", str(params), cwd=tmp_path)
    stats = json.loads((tmp_path / "metrics" / "ingest_stats.json").read_text())
    assert stats["documents"] == 2
    assert stats["dropped"] == {"binary": 1, "empty": 1}
    assert stats["non_utf8_decoded"] == 1


def test_bad_params_name_the_key_and_unknown_stage_is_refused(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["pairs"]["max_seq_len"] = "long"
    params = write_params(tmp_path, data)
    proc = run_cli("bertflow", "stage", "pairs", "-p", str(params), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("pairs.max_seq_len: expected an integer, got str 'long'")
    proc = run_cli("bertflow", "stage", "pretrain-all", "-p", str(params), cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "unknown stage 'pretrain-all'" in proc.stderr


def test_plan_runs_per_task_stages_per_task_and_narrows_to_one_task():
    from pipeline.run_plan import run_plan
    from pipeline.stages import plan
    from tests.conftest import ROOT, project_params

    p = project_params()
    tasks, starts = list(p.finetune.tasks), p.finetune.init  # pretrained, scratch: no adapt or teacher
    names = plan(p)
    assert names[:6] == ["ingest", "clean", "checkpoint", "tokenizer", "pairs", "pretrain"]
    assert names[6:6 + len(tasks)] == [f"task_data@{t}" for t in tasks]
    fits = [f"finetune@{t}-{s}" for t in tasks for s in starts]
    assert names[6 + len(tasks):6 + len(tasks) + len(fits)] == fits  # a stage per task and start
    assert names[-1] == "transfer" and len(names) == 7 + 2 * len(tasks) + len(fits)
    # A stage runs once those it reads have: a task's branch waits for its data and the encoder,
    # not for the other tasks'.
    upstream = run_plan(ROOT, dict.fromkeys(names, ROOT / "params.yaml"), kept=False).upstream
    assert upstream["task_data@trec-6"] == set()
    assert upstream["finetune@trec-6-scratch"] == {*names[:6], "task_data@trec-6"}
    trec = [f for f in fits if "trec-6-" in f]
    assert upstream["evaluate@trec-6"] == {*names[:6], "task_data@trec-6", *trec}
    assert upstream["transfer"] == set(names[:-1])
    assert plan(p, "finetune")[-1] == fits[-1]
    # One task's stage: only what that task needs, not the other tasks' stages; one start's, only
    # that start.
    assert plan(p, "evaluate@trec-6")[6:] == ["task_data@trec-6", "finetune@trec-6-pretrained",
                                              "finetune@trec-6-scratch", "evaluate@trec-6"]
    assert plan(p, "finetune@trec-6-pretrained")[6:] == ["task_data@trec-6", "finetune@trec-6-pretrained"]


@pytest.mark.slow
def test_progress_bars_at_a_terminal_none_in_ci_or_in_a_log(tmp_path):
    import fcntl
    import pty
    import struct
    import termios
    import threading

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"{i}.txt").write_text(f"Document {i} has a sentence. And another one here.")
    params = write_params(tmp_path, small_params(ingest={"sources": [
        {"name": "mine", "kind": "txt_dir", "path": "corpus"}]}))

    def stderr_at_a_terminal(ci: str) -> str:
        main, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))  # 30x120
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "CI": ci}
        proc = subprocess.Popen(["bertflow", "stage", "ingest", "-p", str(params)], cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=terminal)
        os.close(terminal)
        chunks: list[bytes] = []

        def read() -> None:
            while True:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the terminal's other end closed
                    return
                if not chunk:
                    return
                chunks.append(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        assert proc.wait(timeout=300) == 0
        reader.join(timeout=30)
        os.close(main)
        return b"".join(chunks).decode(errors="replace")

    drawn = stderr_at_a_terminal(ci="")
    assert "ingest mine" in drawn and "doc/s" in drawn
    assert "ingest mine" not in stderr_at_a_terminal(ci="true")
    logged = run_cli("bertflow", "stage", "ingest", "-p", str(params), cwd=tmp_path,
                     env={"CI": ""}).stderr  # stderr is a pipe here, as in a log
    assert "ingest mine" not in logged and "doc/s" not in logged


def test_a_copied_checkout_refuses_to_run_the_originals_code(tmp_path):
    # A checkout copied with its .venv: the venv's editable install still imports the original's
    # code, so the copy's edits would silently not run.
    copy = tmp_path / "copy"
    (copy / "pipeline").mkdir(parents=True)
    (copy / "pipeline" / "cli_common.py").write_text("")
    write_params(copy, small_params())
    proc = run_cli("bertflow", "stage", "ingest", cwd=copy, check=False)
    assert proc.returncode != 0
    assert f"{copy} is a checkout of bertflow, but this command runs the code of {ROOT}" in proc.stderr
    assert "make install" in proc.stderr and not (copy / "data").exists()
