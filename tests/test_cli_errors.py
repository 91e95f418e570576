"""Every command, given a broken input, ends in one `error:` line naming what is wrong: exit code
1, no traceback, and nothing in the project changed (the MLflow store aside, which records a
stage's failed run). The commands run in this process, through the console entry point."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.conftest import small_params, tree, write_params

UNTOUCHED_BY_DESIGN = ("mlflow.db", ".bertflow-run.lock")


def _params(root: Path, **sections) -> None:
    write_params(root, small_params(tracking={"uri": "sqlite:///mlflow.db"}, **sections))


def _write(relative: str, content: bytes, **sections) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        _params(root, **sections)
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    return setup


def _with(**sections) -> Callable[[Path], None]:
    return lambda root: _params(root, **sections)


def _raw_params(text: bytes) -> Callable[[Path], None]:
    return lambda root: (root / "params.yaml").write_bytes(text)


def _link_outside(root: Path) -> None:
    _params(root, ingest={"sources": [{"name": "mine", "kind": "txt_dir", "path": "data/user/c"}]})
    (root / "data" / "user" / "c").mkdir(parents=True)
    (root.parent / "elsewhere.txt").write_text("Text from elsewhere. More of it.")
    (root / "data" / "user" / "c" / "a.txt").symlink_to(root.parent / "elsewhere.txt")


def _link_loop(root: Path) -> None:
    _params(root, ingest={"sources": [{"name": "mine", "kind": "txt_dir", "path": "data/user/c"}]})
    (root / "data" / "user" / "c").mkdir(parents=True)
    (root / "data" / "user" / "c" / "a.txt").symlink_to("b.txt")
    (root / "data" / "user" / "c" / "b.txt").symlink_to("a.txt")


def _fifo_task(root: Path) -> None:
    _params(root, finetune={"tasks": {"mine": {"kind": "classification", "source": "data/user/t.csv"}}})
    (root / "data" / "user").mkdir(parents=True)
    os.mkfifo(root / "data" / "user" / "t.csv")  # reading it would wait for a writer forever


JSONL_SOURCE = {"sources": [{"name": "j", "kind": "jsonl", "path": "data/user/docs.jsonl"}]}
PARQUET_SOURCE = {"sources": [{"name": "p", "kind": "parquet", "path": "data/user/docs.parquet"}]}
CSV_TASK = {"tasks": {"mine": {"kind": "classification", "source": "data/user/t.csv"}}}
CONLL_TASK = {"tasks": {"mine": {"kind": "token", "source": "data/user/t.conll"}}}
CASES = {
    # name: (set the project up, the command, what its one error line says)
    "params_missing": (lambda root: None, ["stage", "ingest"], "params.yaml: params file not found"),
    "params_not_utf8": (_raw_params(b"# r\xe9sum\xe9\npretrain: {lr: 0.1}\n"), ["stage", "ingest"],
                        "not UTF-8"),
    "params_key_twice": (_raw_params(b"pretrain:\n  lr: 0.1\n  lr: 0.2\n"), ["run"], "key 'lr' given twice"),
    "params_unknown_key": (_with(clean={"min_sentense_chars": 3}), ["run"],
                           "clean.min_sentense_chars: unknown key"),
    "params_heads_zero": (_with(model={"presets": {"mini": {"layers": 4, "hidden": 256, "heads": 0,
                                                            "intermediate": 1024}}}),
                          ["stage", "ingest"], "model.presets.mini.heads: must be at least 1"),
    "output_is_checkout": (_with(paths={"raw": ""}), ["stage", "ingest"], "paths.raw: '' must be a folder"),
    "output_is_your_data": (_with(paths={"raw": "data/user"}), ["run"], "overlaps paths.user_data"),
    "unknown_stage": (_params, ["stage", "pretrain-all"], "unknown stage 'pretrain-all'"),
    "unknown_task": (_params, ["stage", "task_data@nope"], "no task 'nope' in finetune.tasks"),
    "until_unknown": (_params, ["run", "--until", "bogus"], "unknown stage 'bogus'"),
    "clean_before_ingest": (_params, ["stage", "clean"], "run the ingest stage first"),
    "tokenizer_before_clean": (_params, ["stage", "tokenizer"], "run the clean stage first"),
    "pairs_before_tokenizer": (_params, ["stage", "pairs"], "run the tokenizer stage first"),
    "tokenizer_truncated": (_write("data/tokenizer/tokenizer.json", b'{"version": "1.0", "tru'),
                            ["stage", "pairs"], "tokenizer.json: not a readable tokenizer file"),
    "finetune_before_pretrain": (_params, ["stage", "finetune@movie-sentiment-pretrained"],
                                 "no pretrained encoder; run the pretrain stage first"),
    "evaluate_before_task_data": (_params, ["stage", "evaluate@movie-sentiment"],
                                  "run the task_data stage for this task first"),
    "transfer_before_evaluate": (_params, ["stage", "transfer"], "run evaluate@movie-sentiment first"),
    "corpus_jsonl_bad_line": (_write("data/user/docs.jsonl", b'{"text": "ok"}\n{"text": \n',
                                     ingest=JSONL_SOURCE),
                              ["stage", "ingest"], "docs.jsonl:2: not a valid JSON line"),
    "corpus_missing_folder": (_with(ingest={"sources": [{"name": "m", "kind": "txt_dir", "path": "nope"}]}),
                              ["stage", "ingest"], "ingest source 'm':"),
    "corpus_link_outside": (_link_outside, ["stage", "ingest"], "outside the project"),
    "corpus_link_loop": (_link_loop, ["stage", "ingest"], "a symbolic link loop"),
    "task_source_fifo": (_fifo_task, ["stage", "task_data@mine"], "t.csv is a FIFO, not a file"),
    "schedule_cron_bad": (_with(schedule={"cron": "61 * * * *"}), ["run"],
                          "schedule.cron: '61 * * * *' is not a cron expression"),
    "schedule_timezone_bad": (_with(schedule={"timezone": "Mars/Olympus"}), ["serve"],
                              "schedule.timezone: 'Mars/Olympus' is not a time zone"),
    "embed_blank_text": (_params, ["embed", "--text", "fine", "--text", ""], "--text 2 of 2: empty"),
    "task_csv_header_twice": (_write("data/user/t.csv", b"text,label,text\na,b,c\n", finetune=CSV_TASK),
                              ["stage", "task_data@mine"], "column 'text' appears more than once"),
    "task_csv_empty": (_write("data/user/t.csv", b"", finetune=CSV_TASK), ["stage", "task_data@mine"],
                       "t.csv: empty, not even a header line"),
    "task_csv_short_row": (_write("data/user/t.csv", b"text,label\nfine,a\nno label\n", finetune=CSV_TASK),
                           ["stage", "task_data@mine"], "t.csv:3 (row 2): 1 of the header's 2 fields"),
    "task_conll_no_blank_lines": (_write("data/user/t.conll", b"Word B-PER\n" * 1200, finetune=CONLL_TASK),
                                  ["stage", "task_data@mine"],
                                  "t.conll:1: 1200 tokens from line 1 on without a blank line"),
    "corpus_parquet_unreadable": (_write("data/user/docs.parquet", b"PAR1 nope", ingest=PARQUET_SOURCE),
                                  ["stage", "ingest"], "docs.parquet: not a readable Parquet file"),
    "predict_nothing_registered": (_params, ["predict", "movie-sentiment", "--text", "fine"],
                                   "no registry here yet"),
    "predict_blank_text": (_params, ["predict", "movie-sentiment", "--text", " "], "empty or whitespace"),
    "predict_neither_text_nor_file": (_params, ["predict", "movie-sentiment"], "give --text"),
    "serve_model_nothing_registered": (_params, ["serve-model", "movie-sentiment"], "no registry here yet"),
    "serve_model_folder_outside": (_params, ["serve-model", "x", "--model", "/elsewhere/model"],
                                   "is outside this project"),
    "promote_without_registry": (_params, ["registry", "promote", "nope", "1"], "no registry here yet"),
    "attention_no_encoder": (_params, ["attention", "a bank"], "or give --model FOLDER"),
    "compare_missing_file": (_params, ["compare", "a=nothere.json"], "expected LABEL=PATH of an existing"),
    "store_damaged": (_write("mlflow.db", b"this is not a database" * 100), ["registry", "list"],
                      "mlflow.db"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_input_ends_in_one_error_line_and_changes_nothing(case, tmp_path, monkeypatch, capfd):
    setup, argv, message = CASES[case]
    root = tmp_path / "project"
    root.mkdir()
    setup(root)
    before = tree(root, UNTOUCHED_BY_DESIGN)
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["bertflow", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capfd.readouterr().err
    assert exited.value.code == 1, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, err
    assert tree(root, UNTOUCHED_BY_DESIGN) == before


@pytest.mark.parametrize(("argv", "option"), [
    (["serve-model", "x", "--port", "70000"], "--port"), (["ui", "--port", "0"], "--port"),
    (["server", "start", "--port", "70000"], "--port"),
    (["predict", "x", "--text", "a", "--batch-size", "0"], "--batch-size"),
])
def test_an_option_out_of_range_is_a_usage_error_before_anything_runs(argv, option, tmp_path, monkeypatch,
                                                                     capfd):
    _params(tmp_path)
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bertflow", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capfd.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err, err
    assert f"Invalid value for '{option}'" in err
    assert tree(tmp_path) == before
