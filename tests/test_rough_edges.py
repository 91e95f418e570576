"""The rough edges of daily use: an unknown task, model, alias or version is one line naming what
exists, in every command that takes one; empty text is refused, by the model (REST: 400) and by
`bertflow predict` (naming where it is); a readable `dvc metrics show` and `bertflow metrics`;
a checkout owned by another uid (a Docker bind mount) records its commit or says why not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT, run_cli, small_params, write_params
from tests.test_serving import tiny_task_model

TASKS = {"reviews": ("classification", ("negative", "positive"), [{"text": "a great film"}]),
         "same-topic": ("pair", ("other", "same"), [{"text_a": "a film", "text_b": "the movie"}])}


# The model: blank text is bad input, for every text column ---------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny exported model folder per kind of TASKS (random weights)."""
    root = tmp_path_factory.mktemp("models")
    return {name: tiny_task_model(root / name, kind, labels) for name, (kind, labels, _) in TASKS.items()}


@pytest.mark.parametrize("blank", ["", " ", "\t\n "])
def test_the_model_refuses_empty_or_whitespace_text_in_any_text_column(models, blank):
    from components.core.errors import DataError
    from components.lifecycle.inference import load_task_model, predict_rows

    reviews, pairs = load_task_model(models["reviews"]), load_task_model(models["same-topic"])
    assert len(predict_rows(reviews, [{"text": "a great film"}])) == 1
    with pytest.raises(DataError, match=r"^row 1: column 'text' is empty or whitespace only$"):
        predict_rows(reviews, [{"text": "a great film"}, {"text": blank}])
    for column in ("text_a", "text_b"):  # a pair: both texts
        row = {"text_a": "a film", "text_b": "the movie", column: blank}
        with pytest.raises(DataError, match=rf"^row 0: column '{column}' is empty or whitespace only$"):
            predict_rows(pairs, [row])


def test_a_call_over_the_row_or_text_limits_is_refused_naming_the_limit(models, monkeypatch):
    from dataclasses import replace

    from components.core.errors import DataError
    from components.lifecycle.inference import load_task_model, predict_rows
    from components.lifecycle.rows import Limits

    monkeypatch.setenv("BERTFLOW_MAX_TEXT_CHARS", "40")
    reviews = load_task_model(models["reviews"])
    assert reviews.limits == Limits(max_rows=1000, max_text_chars=40)
    assert len(predict_rows(reviews, [{"text": "x" * 40}])) == 1
    with pytest.raises(DataError, match=r"^row 1: column 'text' holds 41 characters; at most 40 "
                                        r"\(BERTFLOW_MAX_TEXT_CHARS\)$"):
        predict_rows(reviews, [{"text": "fine"}, {"text": "x" * 41}])
    with pytest.raises(DataError, match=r"^3 rows in one call; at most 2 \(BERTFLOW_MAX_ROWS\)"):
        predict_rows(replace(reviews, limits=Limits(max_rows=2)), [{"text": "a film"}] * 3)
    monkeypatch.setenv("BERTFLOW_MAX_ROWS", "lots")
    with pytest.raises(DataError, match=r"^BERTFLOW_MAX_ROWS='lots': must be a positive whole number$"):
        load_task_model(models["reviews"])


def test_the_pyfunc_model_turns_a_blank_text_into_a_bad_request(models, tmp_path):
    # What `mlflow models serve` answers with 400 (tests/test_serving.py asks a real server).
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from components.lifecycle.registry import save_pyfunc

    kind, _, example = TASKS["same-topic"]
    save_pyfunc(models["same-topic"], kind, example, tmp_path / "pyfunc")
    model = mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))
    assert len(model.predict(pd.DataFrame(example))) == 1
    with pytest.raises(MlflowException, match="row 0: column 'text_b' is empty") as refused:
        model.predict(pd.DataFrame([{"text_a": "a film", "text_b": "  "}]))
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


def test_texts_that_are_no_text_are_found_where_a_model_reads_them():
    from components.lifecycle.rows import text_problem

    assert text_problem({"text": " "}, ["text"]) == "'text' is empty or whitespace only"
    assert text_problem({"text": "", "tokens": ["Jones", "spoke"]}, ["text", "tokens"]) is None
    assert text_problem({"text": "ok", "text_b": ""}, ["text"]) is None  # not the model's input
    assert text_problem({"text_a": "ok", "text_b": "\n"}, ["text_a", "text_b"]) == \
        "'text_b' is empty or whitespace only"
    assert text_problem({"text": 5}, ["text"]) == "'text' must be a string, got int"
    assert text_problem({"text": None}, ["text"]) == "'text' must be a string, got null"


@pytest.mark.parametrize(("got", "strict", "problem"), [
    (["text", "id"], False, None),  # carried along by `bertflow predict`
    (["text", "id"], True, "unknown column 'id' (the model reads 'text'; the input has 'text', 'id')"),
    (["text", "text_b"], False, "unknown column 'text_b' (the model reads 'text'; the input has 'text', "
                                "'text_b')"),
    (["review", "label"], False, "missing column 'text' (the model reads 'text'; the input has 'review', "
                                 "'label')"),
    ([], True, "missing column 'text' (the model reads 'text'; the input has none)"),
])
def test_input_columns_are_checked_against_the_models_signature(got, strict, problem):
    from components.lifecycle.rows import column_problem

    assert column_problem(got, ["text"], [], strict) == problem


def test_input_columns_of_pairs_and_of_text_or_tokens():
    from components.lifecycle.rows import column_problem

    assert column_problem(["text"], ["text_a", "text_b"], [], False) == (
        "missing columns 'text_a', 'text_b'; unknown column 'text' (the model reads 'text_a', 'text_b'; "
        "the input has 'text')")
    assert column_problem(["tokens"], [], ["text", "tokens"], True) is None
    assert column_problem(["words"], [], ["text", "tokens"], True) == (
        "missing column 'text' or 'tokens'; unknown column 'words' (the model reads 'text' or 'tokens'; "
        "the input has 'words')")
    assert column_problem(["anything"], [], [], True) is None  # no names: MLflow's to check


def test_input_rows_know_their_line_or_row(tmp_path):
    from components.lifecycle.rows import read_numbered

    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c"}\n')
    assert [[p for p, _ in b] for b in read_numbered(tmp_path / "in.jsonl", 2)] == \
        [["line 1", "line 3"], ["line 4"]]
    # A blank line of a CSV file is a row (of empty cells), not silently skipped.
    (tmp_path / "in.csv").write_text("text\na\n\nc\n")
    assert [[(p, r["text"]) for p, r in b] for b in read_numbered(tmp_path / "in.csv", 2)] == \
        [[("row 1", "a"), ("row 2", "")], [("row 3", "c")]]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("dup.csv", b"review,verdict,review\na,b,c\n", "dup.csv: the header names 'review' more than once"),
    ("wide.csv", b"text,x\na,b,c,d\n", "wide.csv, row 1: 4 fields, the header has 2"),
    ("latin1.csv", b"text\nfine\nna\xefve\n", "latin1.csv, line 3: not UTF-8"),
    ("quote.csv", b'text\n"unterminated\nx\n',
     "quote.csv, line 3: not well-formed CSV (unexpected end of data)"),
    ("empty.csv", b"", "empty.csv: empty, not even a header"),
    ("latin1.jsonl", b'{"text": "ok"}\n{"text": "na\xefve"}\n',
     "latin1.jsonl, line 2: not UTF-8 (byte 13 of the line)"),
])
def test_prediction_input_is_read_strictly(tmp_path, name, content, message):
    from components.core.errors import DataError
    from components.lifecycle.rows import read_numbered

    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError) as e:
        list(read_numbered(tmp_path / name, 2))
    assert str(e.value) == f"{tmp_path / name}{message[len(name):]}"


def test_prediction_input_keeps_line_separators_inside_texts(tmp_path):
    from components.lifecycle.rows import read_numbered

    (tmp_path / "in.jsonl").write_text('{"text": "one\u2028two"}\n{"text": "three"}\n')
    assert [r["text"] for b in read_numbered(tmp_path / "in.jsonl", 5) for _, r in b] == \
        ["one\u2028two", "three"]
    (tmp_path / "in.csv").write_text('text\n"a\n\nb"\n', newline="")
    assert [r["text"] for b in read_numbered(tmp_path / "in.csv", 5) for _, r in b] == ["a\n\nb"]


# The CLI: one line naming what is wrong and what exists ------------------------------------------

@pytest.fixture(scope="module")
def registry_project(models, tmp_path_factory) -> Path:
    """A project whose registry holds TASKS, each a champion, registered as the pipeline does."""
    from components.core import tracking
    from components.core.params import load_params
    from components.lifecycle import registry

    root = tmp_path_factory.mktemp("registry")
    params = write_params(root, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    p = load_params(params)
    client = tracking.client(p.tracking, root)
    with tracking.mlflow_run(p.tracking, root, "registry") as run:
        for name, (kind, _, example) in TASKS.items():
            registry.register_task(client, run, name, kind, models[name], example, "accuracy", 0.5, {})
    return root


def _fails_in_one_line(cwd: Path, *args: str) -> str:
    """`bertflow ARGS` exits 1 with a single `error: ...` line on stderr; returns that line."""
    proc = run_cli("bertflow", *args, cwd=cwd, check=False)
    assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr[-3000:])
    return lines[0]


UNKNOWN = {
    ("predict", "nope", "--text", "hi"): "no registered model 'nope' (registered: reviews, same-topic)",
    ("predict", "reviews", "--model", "models:/reviews/9", "--text", "hi"):
        "registered model 'reviews' has no version 9 (versions 1; aliases candidate -> 1, champion -> 1)",
    ("export-hf", "nope", "out"): "no registered model 'nope' (registered: reviews, same-topic)",
    ("export-hf", "reviews", "out", "--ref", "gold"):
        "registered model 'reviews' has no alias 'gold' (versions 1; aliases candidate -> 1, champion -> 1)",
    ("lineage", "nope@champion"): "no registered model 'nope' (registered: reviews, same-topic)",
    ("lineage", "reviews/3"): "has no version 3 (versions 1;",
    ("registry", "promote", "nope", "1"): "no registered model 'nope' (registered:",
    ("registry", "promote", "reviews", "2"): "has no version 2 (versions 1;",
    ("registry", "rollback", "nope"): "no registered model 'nope' (registered:",
    ("fill-mask", "a [MASK]"): "no registered model 'encoder' (registered: reviews, same-topic); "
                               "or give --model FOLDER",
    ("embed", "--text", "hi", "--model", "nowhere"): "nowhere/bertflow.json: missing",
}


@pytest.mark.slow
def test_unknown_tasks_models_aliases_and_versions_are_one_line_naming_what_exists(registry_project):
    for args, expected in UNKNOWN.items():
        assert expected in _fails_in_one_line(registry_project, *args), args
    assert not (registry_project / "out").exists()
    # Known names still work: the champion without an alias, and an export by alias.
    chain = run_cli("bertflow", "lineage", "reviews", cwd=registry_project).stdout
    assert chain.startswith("reviews = reviews version 1 ")
    run_cli("bertflow", "export-hf", "reviews", str(registry_project / "hf"), "--ref", "candidate",
            cwd=registry_project)
    assert (registry_project / "hf" / "config.json").exists()


@pytest.mark.slow
def test_a_project_without_a_registry_says_so_and_creates_none(tmp_path):
    write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    for args in (("predict", "reviews", "--text", "hi"), ("lineage", "reviews"),
                 ("registry", "rollback", "reviews"), ("export-hf", "reviews", "out")):
        line = _fails_in_one_line(tmp_path, *args)
        assert "no registry here yet" in line and "run `bertflow run` first" in line
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_predict_names_each_blank_text_by_where_it_is(registry_project):
    root = registry_project
    cases = {("--text", "fine", "--text", "  "): "error: --text 2 of 2: empty or whitespace-only text",
             ("--text", "a", "--text-b", ""): "error: --text-b 1 of 1: empty or whitespace-only text"}
    for args, expected in cases.items():
        task = "same-topic" if "--text-b" in args else "reviews"
        assert _fails_in_one_line(root, "predict", task, *args) == expected
    (root / "in.jsonl").write_text('{"text": "a great film"}\n\n{"text": "\\t"}\n')
    (root / "in.csv").write_text('text,note\n"a great film",x\n"  ",y\n')
    (root / "pairs.jsonl").write_text('{"text_a": "a film", "text_b": " "}\n')
    assert _fails_in_one_line(root, "predict", "reviews", "--file", "in.jsonl", "--out", "o.jsonl") == \
        "error: in.jsonl, line 3: 'text' is empty or whitespace only"
    assert _fails_in_one_line(root, "predict", "reviews", "--file", "in.csv") == \
        "error: in.csv, row 2: 'text' is empty or whitespace only"
    assert _fails_in_one_line(root, "predict", "same-topic", "--file", "pairs.jsonl") == \
        "error: pairs.jsonl, line 1: 'text_b' is empty or whitespace only"
    assert not (root / "o.jsonl").exists()
    (root / "dup.csv").write_text("text,note,text\na,b,c\n")
    assert _fails_in_one_line(root, "predict", "reviews", "--file", "dup.csv") == \
        "error: dup.csv: the header names 'text' more than once"
    answers = run_cli("bertflow", "predict", "reviews", "--text", "a great film", cwd=root).stdout
    assert json.loads(answers)["label"] in TASKS["reviews"][1]
    # A backend the model lacks (trained with finetune.onnx off): one line saying so, naming the
    # model by its URI (not the temporary folder it was fetched into, gone when the command ends).
    assert _fails_in_one_line(root, "predict", "reviews", "--backend", "onnx", "--text", "a great film") == (
        "error: model models:/reviews@champion: artifacts/model: no ONNX graph (its start was not in "
        "finetune.onnx when it was trained); backend torch serves it")


@pytest.mark.slow
def test_predict_names_missing_and_unknown_columns_and_non_text_values_by_where_they_are(registry_project):
    root = registry_project
    files = {"nocol.csv": "review,label\nfine film,pos\n",
             "pair.jsonl": '{"text": "good", "text_b": "bad"}\n',
             "gap.jsonl": '{"text": "good"}\n{"txt": "a typo"}\n',
             "number.jsonl": '{"text": "good"}\n\n{"text": 5}\n',
             "null.jsonl": '{"text": null}\n'}
    for name, content in files.items():
        (root / name).write_text(content)
    cases = {
        ("reviews", "--file", "nocol.csv"):  # MLflow's own line quoted the batch and cut this
            "error: nocol.csv: missing column 'text' (the model reads 'text'; the input has 'review', "
            "'label')",
        ("reviews", "--file", "pair.jsonl"):  # MLflow would drop text_b unread
            "error: pair.jsonl, line 1: unknown column 'text_b' (the model reads 'text'; the input has "
            "'text', 'text_b')",
        ("reviews", "--file", "gap.jsonl"):
            "error: gap.jsonl, line 2: missing column 'text' (the model reads 'text'; the input has 'txt')",
        ("reviews", "--file", "number.jsonl"):
            "error: number.jsonl, line 3: 'text' must be a string, got int",
        ("reviews", "--file", "null.jsonl"): "error: null.jsonl, line 1: 'text' must be a string, got null",
        ("same-topic", "--file", "nocol.csv"):
            "error: nocol.csv: missing columns 'text_a', 'text_b' (the model reads 'text_a', 'text_b'; the "
            "input has 'review', 'label')",
        ("reviews", "--text", "good", "--text-b", "bad"):
            "error: --text-b: the model reads 'text', not pairs of texts: give --text alone",
        ("same-topic", "--text", "good"):
            "error: the model reads pairs of texts ('text_a', 'text_b'): give a --text-b with each --text",
        ("reviews", "--text", "good", "--batch-size", "1001"):
            "error: --batch-size 1001: a model call holds at most 1000 rows (BERTFLOW_MAX_ROWS); give a "
            "smaller one",
    }
    for args, expected in cases.items():
        assert _fails_in_one_line(root, "predict", *args, "--out", "o.jsonl") == expected, args
    assert not (root / "o.jsonl").exists()
    # Columns no model reads are carried along, and MLflow has nothing to warn about.
    (root / "ids.csv").write_text("id,text\n7,a great film\n")
    proc = run_cli("bertflow", "predict", "reviews", "--file", "ids.csv", cwd=root)
    answer = json.loads(proc.stdout)
    assert answer["id"] == "7" and answer["label"] in TASKS["reviews"][1]
    assert "extra inputs" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_pickled_model_in_the_projects_store_is_refused_without_trust_model(registry_project, tmp_path):
    import mlflow
    from mlflow.pyfunc import PythonModel

    from components.core import tracking
    from components.core.params import load_params

    marker = tmp_path / "payload-ran"

    class Pickled(PythonModel):  # unpickling it writes a file (it could run anything)
        def __reduce__(self):
            return (Path.write_text, (marker, "the payload ran"))

    # (given requirements: inferring them would load the model, and run the payload, here)
    mlflow.pyfunc.save_model(path=str(tmp_path / "pickled"), python_model=Pickled(),
                             pip_requirements=["mlflow"])
    p = load_params(registry_project / "params.yaml")
    with tracking.mlflow_run(p.tracking, registry_project, "not bertflow's") as run:
        tracking.client(p.tracking, registry_project).log_artifacts(run.run_id, str(tmp_path / "pickled"),
                                                                    "pickled")
    uri = f"runs:/{run.run_id}/pickled"
    assert not marker.exists()
    line = _fails_in_one_line(registry_project, "predict", "reviews", "--model", uri, "--text", "fine")
    assert line.startswith(f"error: model {uri} holds what loading would unpickle (python_model.pkl"), line
    assert line.endswith("which can run any code; pass --trust-model if you trust who wrote it")
    assert not marker.exists()


# Metrics: a readable default ---------------------------------------------------------------------

def test_dvc_declares_only_the_headline_stats_as_metrics_and_every_stats_file_as_an_output():
    from pipeline.stages import STAGES

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared, metrics = set(), set()
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for kind in ("outs", "metrics"):
            for entry in body.get(kind, []):
                path, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
                declared.add(path)
                if kind == "metrics":
                    metrics.add(path)
                if path.endswith("_stats.json"):
                    assert options.get("cache") is False, (name, path)  # kept in git, as before
        stats = STAGES[name].stats.replace("{task}", "${item.task}" if STAGES[name].per_start else "${key}")
        assert stats.replace("{start}", "${item.start}") in declared, name
    assert metrics == {"${paths.metrics}/pretrain_stats.json", "${paths.metrics}/transfer_stats.json"}
    assert "${paths.metrics}/transfer_stats.json" in declared


def test_dvc_metrics_show_fits_a_screen():
    proc = run_cli("dvc", "metrics", "show", "--json", cwd=ROOT)
    files = json.loads(proc.stdout)[""]["data"]
    # Each pipeline's two headline files (the presets' own pipelines add theirs, in their folders).
    default = {"metrics/pretrain_stats.json", "metrics/transfer_stats.json"}
    assert default <= set(files)
    assert {Path(f).name for f in files} == {"pretrain_stats.json", "transfer_stats.json"}, sorted(files)
    columns = {key: v for f in default for key, v in _flat(files[f].get("data", {}))}
    # About 20 numbers to compare (docs/stages.md), not one per fit or per stage; beside them the
    # text that says how they were made (precision, compile, the machine), a handful more.
    numbers = [k for k, v in columns.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) <= 20, sorted(numbers)
    assert len(columns) <= 2 * 20, sorted(columns)


def _flat(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    return [kv for key, v in data.items()
            for kv in (_flat(v, f"{prefix}{key}.") if isinstance(v, dict) else [(prefix + key, v)])]


def test_bertflow_metrics_prints_each_stage_and_each_tasks_scores(tmp_path):
    write_params(tmp_path, yaml.safe_load((ROOT / "params.yaml").read_text()))
    shutil.copytree(ROOT / "metrics", tmp_path / "metrics", ignore=shutil.ignore_patterns("*.png", "*.csv"))
    out = run_cli("bertflow", "metrics", cwd=tmp_path).stdout
    lines = out.splitlines()
    assert max(map(len, lines)) <= 130
    pretrain = json.loads((ROOT / "metrics" / "pretrain_stats.json").read_text())
    assert any(line.startswith("pretrain ") and f"mlm_accuracy {pretrain['mlm_accuracy']:.4g}" in line
               for line in lines)
    transfer = json.loads((ROOT / "metrics" / "transfer.json").read_text())
    tasks = list(yaml.safe_load((ROOT / "params.yaml").read_text())["finetune"]["tasks"])
    rows = [line.split() for line in lines if line.split() and line.split()[0] in transfer]
    assert [r[0] for r in rows] == tasks  # in params order
    for row in rows:
        t = transfer[row[0]]
        assert f"{100 * t['pretrained']['mean']:.1f}" == row[3]
        assert f"{100 * t['scratch']['mean']:.1f}" == row[6]
    # Before any run: says so, per stage.
    empty = tmp_path / "empty"
    write_params(empty, yaml.safe_load((ROOT / "params.yaml").read_text()))
    assert "transfer: not run yet" in run_cli("bertflow", "metrics", cwd=empty).stdout


# Docker: a checkout owned by another uid ---------------------------------------------------------

def test_the_image_trusts_the_mounted_checkout_for_any_uid_and_says_how_to_run_as_its_owner():
    docker = (ROOT / "Dockerfile").read_text()
    assert "git config --system --add safe.directory '*'" in docker and "WORKDIR /work" in docker
    assert "chmod 1777 /home/bertflow" in docker and "HOME=/home/bertflow" in docker
    # At its own path, so that mlflow.db's absolute artifact locations hold on both sides.
    assert 'docker run --rm --user "$(id -u):$(id -g)" -v "$PWD:$PWD" -w "$PWD"' in docker
    assert '--user "$(id -u):$(id -g)"' in (ROOT / "docs" / "lifecycle.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_checkout_of_another_uid_records_its_commit_once_marked_safe_or_warns(tmp_path):
    # As in the container: the checkout belongs to another uid (the host user) and git, run by
    # this one, finds it "dubious". The image marks /work safe in the system git config; here a
    # system config file of the same content, for this checkout, stands in for it.
    checkout = Path(tempfile.mkdtemp(prefix="bertflow-mount-"))
    try:
        (checkout / "data" / "user").mkdir(parents=True)
        docs = [{"text": f"Report {i} opens here. It says something about topic {i}. Then it ends."}
                for i in range(20)]
        (checkout / "data" / "user" / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        write_params(checkout, small_params(
            ingest={"sources": [{"name": "mine", "kind": "jsonl", "path": "data/user/docs.jsonl"}]},
            tracking={"uri": "sqlite:///mlflow.db"}))
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "mine"]):
            run_cli(*cmd, cwd=checkout)
        commit = run_cli("git", "rev-parse", "HEAD", cwd=checkout).stdout.strip()
        shutil.chown(checkout, 12345, 12345)
        for path in checkout.rglob("*"):
            os.chown(path, 12345, 12345, follow_symlinks=False)
        home = tmp_path / "home"
        home.mkdir()
        (tmp_path / "gitconfig").write_text(f"[safe]\n\tdirectory = {checkout}\n")
        env = {"PATH": f"{BIN}{os.pathsep}/usr/bin:/bin", "HOME": str(home), "USER": "bertflow"}

        unsafe = subprocess.run(["bertflow", "stage", "ingest"], cwd=checkout, capture_output=True,
                                text=True, env={**env, "GIT_CONFIG_SYSTEM": os.devnull})
        assert unsafe.returncode == 0, unsafe.stderr[-3000:]
        assert f"warning: git cannot read {checkout} (fatal: detected dubious ownership" in unsafe.stderr
        assert '--user "$(id -u):$(id -g)"' in unsafe.stderr
        safe = subprocess.run(["bertflow", "stage", "ingest"], cwd=checkout, capture_output=True,
                              text=True, env={**env, "GIT_CONFIG_SYSTEM": str(tmp_path / "gitconfig")})
        assert safe.returncode == 0 and "warning: git" not in safe.stderr, safe.stderr[-3000:]

        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{checkout / 'mlflow.db'}")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  order_by=["attributes.start_time ASC"])
        assert [r.data.tags["git.commit"] for r in runs] == ["none", commit]
        assert "dubious ownership" in runs[0].data.tags["git.error"]  # why, in MLflow too
        assert "git.error" not in runs[1].data.tags
    finally:
        shutil.rmtree(checkout, ignore_errors=True)


# Before anything runs: a stage of an unknown task, a Prefect API that does not answer ----------

def test_a_stage_of_an_unknown_task_is_refused_before_anything_is_recorded(tmp_path):
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    out = run_cli("bertflow", "stage", "task_data@nope", cwd=tmp_path, check=False)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"error: {params}: no task 'nope' in finetune.tasks (tasks: ")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run was opened for it


@pytest.mark.parametrize("command", [["run", "--until", "ingest"], ["serve", "--until", "ingest"]])
def test_an_unreachable_prefect_api_is_one_line_before_any_stage(tmp_path, command):
    import socket

    write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # free once closed: nothing answers there
    url = f"http://user:{'s3cret-token'}@127.0.0.1:{port}/api"
    out = run_cli("bertflow", *command, cwd=tmp_path, check=False, env={"PREFECT_API_URL": url})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: the Prefect API at http://user:***@127.0.0.1:{port}/api (PREFECT_API_URL) does "
        "not answer: start that server, or unset PREFECT_API_URL to run without one"]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("command", [["registry", "list"], ["stage", "ingest"],
                                     ["predict", "x", "--text", "hi"]])
def test_a_damaged_tracking_store_is_one_line_in_every_command(tmp_path, command):
    write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    (tmp_path / "mlflow.db").write_text("garbage, not a database\n")
    out = run_cli("bertflow", *command, cwd=tmp_path, check=False)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"error: {tmp_path / 'mlflow.db'}: cannot read the MLflow store (file is not a database)")
    assert "Traceback" not in out.stderr and not (tmp_path / "data" / "raw").exists()


# Faults are failures: a full disk under the DVC cache ---------------------------------------------

@pytest.fixture
def full_cache(tmp_path) -> Path:
    """A 64 kB tmpfs for the DVC cache: the first file copied into it fills it (ENOSPC)."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    yield tiny
    subprocess.run(["umount", "-l", str(tiny)], check=True)


@pytest.mark.slow
def test_a_cache_copy_that_fails_fails_the_stage_and_records_nothing(dvc_project, full_cache):
    from components.core.errors import BertflowError
    from pipeline import versioning

    run_cli("bertflow", "stage", "ingest", cwd=dvc_project)  # the stage; the flow then records it
    run_cli("dvc", "cache", "dir", str(full_cache), cwd=dvc_project)
    # DVC logs the failed copy and records the stage anyway ("not in cache" afterwards).
    with pytest.raises(BertflowError, match=r"stage ingest: DVC could not store its outputs in its "
                                            r"cache \(data/raw: not in cache\); dvc.lock is left"):
        versioning.commit(dvc_project, "ingest")
    assert not (dvc_project / "dvc.lock").exists()
    assert versioning.is_stale(dvc_project, "ingest")  # so the next run does it again


@pytest.mark.slow
def test_a_damaged_dvc_lock_is_one_line_that_says_how_to_put_it_back(dvc_project):
    (dvc_project / "dvc.lock").write_text("stages: [cut short by a crash\n")
    out = run_cli("bertflow", "run", "--until", "ingest", cwd=dvc_project, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("error: ")] == [
        "error: DVC: unable to read: 'dvc.lock', YAML file structure is corrupted; `git checkout "
        "dvc.lock` puts back the committed one"]


def test_a_stage_of_a_task_dvc_yaml_does_not_list_yet_is_one_line_saying_how_to_add_it(dvc_project):
    # params.yaml gained a task; dvc.yaml, written before, has no task_data@reviews yet.
    params = yaml.safe_load((dvc_project / "params.yaml").read_text())
    params["finetune"]["tasks"]["reviews"] = {"kind": "classification", "source": "data/user/r.csv"}
    (dvc_project / "params.yaml").write_text(yaml.safe_dump(params))
    out = run_cli("bertflow", "stage", "task_data@reviews", cwd=dvc_project, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("error: ")] == [
        "error: dvc.yaml has no stage task_data@reviews: it was written before params.yaml named it; "
        "`bertflow run` brings dvc.yaml up to date first, or run `python -m pipeline.deps --write`"]


@pytest.mark.slow
def test_a_stage_that_fails_under_run_prints_no_traceback_of_prefects_before_its_error(tmp_path):
    (tmp_path / "data" / "user").mkdir(parents=True)
    (tmp_path / "data" / "user" / "docs.jsonl").write_text('{"text": "Fine. Also fine."}\n{broken\n')
    write_params(tmp_path, small_params(
        ingest={"sources": [{"name": "mine", "kind": "jsonl", "path": "data/user/docs.jsonl"}]},
        tracking={"uri": "sqlite:///mlflow.db"}))
    out = run_cli("bertflow", "run", "--until", "ingest", cwd=tmp_path, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {tmp_path / 'data/user/docs.jsonl'}:2: not a valid JSON line (Expecting "
                      "property name enclosed in double quotes: line 1 column 2 (char 1))"]


def test_a_temporary_prefect_server_slow_to_start_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    # A timeout of 0 s: Prefect gives up on its temporary server before asking it once, as it
    # does after 120 s on a machine too busy to start it.
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the default: no API configured
    write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    out = run_cli("bertflow", "run", "--until", "ingest", cwd=tmp_path, check=False,
                  env={"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: Prefect's temporary API server did not answer within 0 s "
        "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; a busy machine starts it slowly): give it "
        "longer (export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=300), or run on the project's "
        "Prefect server: `bertflow server start`, then export the PREFECT_API_URL it prints"]
    assert out.stderr.rstrip().endswith(errors[0])  # nothing of Prefect's after it
    assert not (tmp_path / "data").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_export_hf_ends_once_its_folder_is_written_and_keeps_what_it_printed(registry_project, tmp_path):
    # Python's own way out, the teardown of the ~3,000 modules loaded (the `# cleanup[...]` lines
    # of -v), took from seconds to minutes after the folder was complete; the command skips it.
    # The console script itself: a forked test command never goes through that teardown.
    out = subprocess.run([str(BIN / "bertflow"), "export-hf", "reviews", str(tmp_path / "hf")],
                         cwd=registry_project, capture_output=True, text=True,
                         env={**os.environ, "PYTHONVERBOSE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == (f"{tmp_path / 'hf'}: BertForSequenceClassification with 2 labels (load "
                          "with transformers' from_pretrained)\n")  # flushed before the exit
    assert "# cleanup[" not in out.stderr
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        ".bertflow-owned", "config.json", "model.safetensors", "tokenizer.json"]


# Names MLflow accepts: one name per path, however a param writes it ------------------------------

FORMS = {  # how a user may write a path (the first: as it is)
    "as is": lambda path: path,
    "trailing slash": lambda path: f"{path}/",
    "./": lambda path: path if path.startswith("/") else f"./{path}",
    "x/../x": lambda path: f"{path}/../{Path(path).name}",
    "double slash": lambda path: path.replace("/", "//"),
}


def _path_params(obj, name: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every path param in params `obj`, in lists and mappings too."""
    from typing import get_args

    from pydantic import BaseModel

    from components.core.config import PathParam

    normalized = get_args(PathParam)[1]
    if isinstance(obj, BaseModel):
        return [pair for field, info in type(obj).model_fields.items() for pair in (
            [(f"{name}{field}", getattr(obj, field))] if any(rule is normalized for rule in info.metadata)
            else _path_params(getattr(obj, field), f"{name}{field}."))]
    if isinstance(obj, dict | list):
        return [pair for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj))
                for pair in _path_params(value, f"{name}{key}.")]
    return []


def test_lineage_tag_and_param_names_are_one_name_per_path_however_written(tmp_path):
    from components.core import tracking
    from components.core.params import load_params

    p = load_params(write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"})))
    found = dict(_path_params(p))
    assert {"paths.raw", "ingest.sources.0.path", "finetune.tasks.trec-6.source",
            "distill.teacher"} <= set(found)
    # Every path param's value, and folders of the user's: the issue's, and ones whose names hold
    # characters MLflow refuses in a tag or param name.
    paths = sorted({v for v in found.values() if v} | {"data/user/rt-fresh", "data/user/ner",
                                                        "data/user/my reviews (2024)", "data/user/a:b"})
    client = tracking.client(p.tracking, tmp_path)
    recorded = {}
    for form, write in FORMS.items():
        names = {tracking.DEP_TAG + write(path): path for path in paths}
        with tracking.mlflow_run(p.tracking, tmp_path, form, tags=names, key=form) as run:
            run.set_tags(names)  # a stage's own tags, and its params, through the same names
            run.log_params(names)
        tracking.tag_attempt(p.tracking, tmp_path, form, names)  # the flow's lineage, afterwards
        logged = client.get_run(run.run_id)
        assert logged.info.status == "FINISHED", form
        recorded[form] = ({k: v for k, v in logged.data.tags.items() if k.startswith(tracking.DEP_TAG)},
                          logged.data.params)
    tags, params = recorded["as is"]
    assert all(names == (tags, params) for names in recorded.values()), recorded
    assert tags == params and sorted(tags.values()) == paths  # no two paths became one name
    assert tags["dvc.dep.data/user/rt-fresh"] == "data/user/rt-fresh"  # a plain path is its own name
    assert tracking.mlflow_key("dvc.dep.data/user/a(1)") != tracking.mlflow_key("dvc.dep.data/user/a[1]")
