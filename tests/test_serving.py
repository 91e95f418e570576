"""Serving needs no training code: the pyfunc model and `bertflow predict` load and answer with
Lightning unimportable, and import nothing of components.training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, small_params, task_config, write_params

WORDS = ["great", "film", "awful", "boring", "the", "a", "was", "movie", "loved", "hated"]


def tiny_task_model(root: Path, kind: str = "classification",
                    labels: tuple[str, ...] = ("negative", "positive"), scheme: str = "") -> Path:
    """An exported task model folder `root/model` of a classification or pair task, or a token
    task of plain tags (random weights: serving, not quality, is under test)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    from components.data.tokenizer import SPECIAL_TOKENS, UNK, add_template
    from components.model.build import task_model
    from components.model.folders import write_task_model
    from components.model.metadata import TaskModelInfo
    from tests.conftest import encoder_config

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + WORDS)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    add_template(tok)
    (root / "tok").mkdir(parents=True)
    tok.save(str(root / "tok" / "tokenizer.json"))
    cfg = encoder_config(len(vocab), hidden=16, layers=1, heads=2, intermediate=32, max_position=32)
    info = TaskModelInfo(config=cfg, task=task_config(kind, "reviews.csv"), fit="pretrained-s1",
                         labels=list(labels), space=list(labels), max_seq_len=32, label_subwords="all",
                         crf=False, scheme=scheme)
    write_task_model(task_model(cfg, kind, list(labels)), info, root / "tok", root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def pyfunc_model(tmp_path_factory) -> Path:
    """A classification model saved as the registry saves it: a pyfunc model logged as code."""
    from components.lifecycle.registry import save_pyfunc

    root = tmp_path_factory.mktemp("serving")
    save_pyfunc(tiny_task_model(root), "classification", [{"text": "a great film"}], root / "pyfunc")
    return root / "pyfunc"


@pytest.fixture(scope="module")
def no_lightning(tmp_path_factory) -> Path:
    """A folder that, first on PYTHONPATH, makes `import lightning` fail as if not installed."""
    folder = tmp_path_factory.mktemp("blocked")
    for name in ("lightning", "pytorch_lightning"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return folder


def test_a_plain_tag_model_answers_tags_and_exports_to_transformers_alike(tmp_path):
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from components.lifecycle.hf_export import export_hf
    from components.lifecycle.inference import load_task_model, predict_rows

    tags = ("NOUN", "VERB", "DET")
    model = load_task_model(tiny_task_model(tmp_path, "token", tags, scheme="plain"))
    words = "the movie was great".split()
    (answer,) = predict_rows(model, [{"tokens": words}])
    assert set(answer) == {"tokens", "tags"} and len(answer["tags"]) == 4
    assert set(answer["tags"]) <= set(tags)
    export_hf(tmp_path / "model", tmp_path / "hf")
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tokenizer([words], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        best = hf(**enc).logits.argmax(-1)[0]
    first = [enc.word_ids(0).index(i) for i in range(len(words))]
    assert [hf.config.id2label[int(best[i])] for i in first] == answer["tags"]


def test_the_pyfunc_model_answers_without_lightning(pyfunc_model, no_lightning):
    code = (f"import sys, mlflow, pandas as pd\n"
            f"m = mlflow.pyfunc.load_model({str(pyfunc_model)!r})\n"
            f"out = m.predict(pd.DataFrame({{'text': ['loved the movie', 'boring film']}}))\n"
            f"print([sorted(a) for a in out])\n"
            f"print(sorted(n for n in sys.modules if n.startswith(('lightning', 'components.training'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(no_lightning),
                               "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers, imported = proc.stdout.strip().splitlines()[-2:]
    assert answers == "[['label', 'score'], ['label', 'score']]"
    assert imported == "[]"


@pytest.mark.slow
def test_bertflow_predict_answers_without_lightning(pyfunc_model, no_lightning, tmp_path):
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    # A model folder from outside the project is unpickled by MLflow: only when trusted.
    refused = run_cli("bertflow", "predict", "reviews", "--model", str(pyfunc_model), "--text",
                      "what a great film", "-p", str(params), cwd=tmp_path, check=False)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: --model {pyfunc_model} is outside this project ({tmp_path}); loading a model runs the "
        "code it holds (models from code, a loader module, a pickle): pass --trust-model if you trust "
        "who wrote it"]
    proc = run_cli("bertflow", "predict", "reviews", "--model", str(pyfunc_model), "--trust-model",
                   "--text", "what a great film", "-p", str(params), cwd=tmp_path,
                   env={"PYTHONPATH": str(no_lightning)})
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["text"] == "what a great film" and answer["label"] in ("negative", "positive")
    assert 0.5 <= answer["score"] <= 1.0


@pytest.mark.slow
def test_rest_answers_bad_columns_deep_nesting_blank_text_and_requests_over_the_limits_with_400_or_413(
        pyfunc_model, tmp_path):
    import httpx

    from tests.test_lifecycle import _env, _free_port, _start, _stop

    # `bertflow serve-model`: MLflow's scoring server (`mlflow models serve` is tested in
    # test_lifecycle and test_pipeline) behind a request-body limit, here 250,000 bytes.
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    port = _free_port()
    server = _start(["bertflow", "serve-model", "reviews", "--model", str(pyfunc_model), "--trust-model",
                     "--port", str(port), "--max-body-mb", "0.25", "-p", str(params)], tmp_path,
                    _env(BERTFLOW_MAX_ROWS="4", BERTFLOW_MAX_TEXT_CHARS="1000"),
                    f"http://127.0.0.1:{port}/ping", tmp_path / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}/invocations"
        fine = httpx.post(url, json={"dataframe_records": [{"text": "a great film"}]}, timeout=60)
        assert fine.status_code == 200 and fine.json()["predictions"][0]["label"] in ("negative", "positive")
        for blank in ("", " ", "\t\n"):
            answer = httpx.post(url, json={"dataframe_records": [{"text": "a great film"}, {"text": blank}]},
                                timeout=60)
            assert answer.status_code == 400, (blank, answer.text)
            assert "row 1: column 'text' is empty or whitespace only" in answer.json()["message"]
        # Columns the model does not read are refused, not dropped unread (MLflow's default), in
        # every input format; so is a request without the model's column.
        for body, message in (
                ({"dataframe_records": [{"text": "good", "text_b": "bad"}]}, "unknown column 'text_b' (the "
                 "model reads 'text'; the input has 'text', 'text_b')"),
                ({"dataframe_split": {"columns": ["text", "id"], "data": [["good", 7]]}},
                 "unknown column 'id'"),
                ({"inputs": {"text": ["good"], "text_b": ["bad"]}}, "unknown column 'text_b'"),
                ({"dataframe_records": [{"review": "good"}]},
                 "missing column 'text'; unknown column 'review'")):
            answer = httpx.post(url, json=body, timeout=60)
            assert answer.status_code == 400 and message in answer.json()["message"], (body, answer.text)
        # Nesting past what a row needs is refused before MLflow's parser recurses into it (100,000
        # levels overflowed the stack: a 500); brackets inside a text do not count.
        for depth in (100_000, 33):
            deep = b"[" * depth + b"]" * depth
            answer = httpx.post(url, content=deep, headers={"content-type": "application/json"}, timeout=60)
            assert answer.status_code == 400, answer.text
            assert answer.json()["message"] == (f"the request body's JSON nests {depth:,} levels deep; at "
                                                "most 32 (a row of texts or tokens needs 4)")
        brackets = httpx.post(url, json={"dataframe_records": [{"text": "[" * 500 + " a film"}]}, timeout=60)
        assert brackets.status_code == 200, brackets.text
        # The limits whoever serves the model set: one request cannot take the server's memory.
        for records, message in (([{"text": "a great film"}] * 5, "5 rows in one call; at most 4"),
                                 ([{"text": "film " * 201}], "row 0: column 'text' holds 1,005 characters")):
            answer = httpx.post(url, json={"dataframe_records": records}, timeout=60)
            assert answer.status_code == 400 and message in answer.json()["message"], answer.text
        # A body over the limit never reaches the model: by its Content-Length, or as it arrives.
        big = json.dumps({"dataframe_records": [{"text": "film " * 60_000}]}).encode()
        answer = httpx.post(url, content=big, headers={"content-type": "application/json"}, timeout=60)
        assert answer.status_code == 413, answer.text
        assert answer.json()["message"].startswith(f"the request body is {len(big):,} bytes; at most "
                                                   "250,000 bytes (bertflow serve-model --max-body-mb)")
        chunked = httpx.post(url, content=iter([big[:150_000], big[150_000:]]),
                             headers={"content-type": "application/json"}, timeout=60)
        assert chunked.status_code == 413 and "over 250,000 bytes" in chunked.json()["message"]
        assert httpx.post(url, json={"dataframe_records": [{"text": "a great film"}]},
                          timeout=60).status_code == 200
    finally:
        _stop(server)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]


def test_json_depth_counts_brackets_outside_strings_in_linear_time():
    import time

    from pipeline.ops.body_limit import json_depth

    assert json_depth(b"") == 0 and json_depth(b'"text"') == 0
    assert json_depth(json.dumps({"dataframe_records": [{"tokens": ["[", "{{", "]"]}]}).encode()) == 4
    assert json_depth(json.dumps({"text": 'a \\" [[[ \\\\'}).encode() + b"[[]]") == 2  # escapes
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert json_depth(b'[["unterminated [[[[') == 2  # invalid JSON: MLflow's parser says so
    # A string left open, with escaped quotes in it: a regex that can fail there is retried from
    # every quote after it (quadratic: 30 s for this body).
    started = time.monotonic()
    assert json_depth(b'[ "' + b'a\\"' * 30_000) == 1
    assert time.monotonic() - started < 5
class _Payload:
    """What a pickled model can hold: unpickling it writes a file (it could run anything)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "the payload ran"))


_ECHO = ("from pathlib import Path\n"
         "Path({marker!r}).write_text('the model ran its code')\n"
         "class Echo:\n"
         "    def predict(self, *args, **kwargs):\n"
         "        return [{{'label': 'ran'}}]\n")
RUNS = {"code": "model code model.py", "loader": "code folder code, loader_module bertflow_test_loader",
        "pickle": "python_model.pkl, python_function flavor without model code (a pickled model)"}
"""How a model folder runs code when MLflow loads it, and what the refusal names."""


def _model_running_code(folder: Path, how: str, marker: Path) -> None:
    """An MLflow model folder that, loaded, writes `marker` (it could run anything): by its
    models-from-code file, by a loader module in its code folder, or by a pickle."""
    import pickle

    import yaml

    folder.mkdir(parents=True)
    code = _ECHO.format(marker=str(marker))
    if how == "code":
        (folder / "model.py").write_text(code + "from mlflow.pyfunc import PythonModel\n"
                                         "class Model(PythonModel):\n"
                                         "    def predict(self, context, model_input, params=None):\n"
                                         "        return Echo().predict()\n"
                                         "import mlflow\nmlflow.models.set_model(Model())\n")
        flavor = {"loader_module": "mlflow.pyfunc.loaders.code_model", "model_code_path": "model.py"}
    elif how == "loader":
        (folder / "code").mkdir()
        (folder / "code" / "bertflow_test_loader.py").write_text(
            code + "def _load_pyfunc(path, model_config=None):\n    return Echo()\n")
        flavor = {"loader_module": "bertflow_test_loader", "code": "code"}
    else:
        (folder / "python_model.pkl").write_bytes(pickle.dumps(_Payload(marker)))
        flavor = {"loader_module": "mlflow.pyfunc.model", "python_model": "python_model.pkl"}
    (folder / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": flavor}}))


@pytest.mark.slow
def test_a_model_folder_runs_its_code_only_with_trust_model_inside_the_project_as_outside(tmp_path):
    project = tmp_path / "project"
    write_params(project, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    for how, names in RUNS.items():
        marker = tmp_path / f"{how}-ran"
        model = project / "data" / "user" / how  # the user's own data: files from anywhere
        _model_running_code(model, how, marker)
        for command in (["predict", "reviews", "--text", "fine"], ["serve-model", "reviews"]):
            refused = run_cli("bertflow", *command, "--model", str(model), cwd=project, check=False)
            assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
                f"error: --model {model} is a model folder, not a model of the project's registry, and "
                f"loading it runs the code it holds ({names}): pass --trust-model if you trust who "
                "wrote it, or give a models:/ or runs:/ URI"], refused.stderr
        assert not marker.exists(), how
        # Trusted, it runs: the refusal is what kept it from running.
        run_cli("bertflow", "predict", "reviews", "--model", str(model), "--trust-model", "--text", "fine",
                cwd=project, check=False)
        assert marker.exists(), how
    marker = tmp_path / "outside-ran"
    _model_running_code(tmp_path / "elsewhere", "code", marker)
    refused = run_cli("bertflow", "predict", "reviews", "--model", str(tmp_path / "elsewhere"), "--text",
                      "fine", cwd=project, check=False)
    assert refused.returncode == 1 and "is outside this project" in refused.stderr and not marker.exists()


def test_a_model_bertflow_saved_holds_nothing_to_unpickle_and_only_its_own_code(pyfunc_model, tmp_path):
    from components.lifecycle.registry import code_in, pickles_in

    assert pickles_in(pyfunc_model) == []
    assert code_in(pyfunc_model) == ["model code pyfunc_model.py", "code folder code"]
    # Where a model comes from the project's store, only MLflow's own loaders may run.
    unpickled = {"code": [], "loader": ["loader_module bertflow_test_loader"],
                 "pickle": RUNS["pickle"].split(", ")}
    for how, names in RUNS.items():
        _model_running_code(tmp_path / how, how, tmp_path / "never")
        assert pickles_in(tmp_path / how) == unpickled[how], how
        assert ", ".join(code_in(tmp_path / how)) == names
    assert not (tmp_path / "never").exists()


def test_a_model_exported_before_task_defaults_still_loads(tmp_path):
    # Its record kept a rate apart from its grid and 0 for "finetune's value" (epochs, patience,
    # max_seq_len): read in today's schema, the length is the record's own.
    import json

    from components.model.metadata import INFO_FILE, read_task_model_info

    model = tiny_task_model(tmp_path)
    record = json.loads((model / INFO_FILE).read_text())
    record["task"].update(lr=0.0, lr_grid=[], teacher_lr=0.0, max_seq_len=0, epochs=0, patience=0,
                          chunk_overlap=8)
    (model / INFO_FILE).write_text(json.dumps(record))
    info = read_task_model_info(model)
    assert (info.task.kind, info.task.max_seq_len, info.max_seq_len) == ("classification", 32, 32)
