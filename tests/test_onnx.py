"""ONNX Runtime serving: each head kind's graph answers as torch does at shapes other than the
traced ones (classic and modern encoders, the CRF decoded outside the graph); finetune.onnx
writes the graph and the int8 check; the int8 model is served only where the check passed, by
the inference path and the pyfunc model alike."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import torch

from components.core.config import FinetuneConfig, TaskConfig
from components.core.errors import ConfigError
from components.lifecycle.backends import BACKEND_ENV
from components.model.build import task_model
from components.model.encoder import SelfAttention
from components.model.onnx_model import CHECK, FP32, INT8, ONNX_DIR, OnnxHead, export_graph, onnx_file
from tests.conftest import encoder_config, section, task_config

CLASSIC = encoder_config(120, hidden=32, layers=2, heads=2, intermediate=64, max_position=64)
MODERN = encoder_config(120, "modern", hidden=32, layers=2, heads=2, intermediate=48, max_position=64,
                        local_window=8, global_every=2)
BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _inputs(kind: str, B: int, T: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A padded batch (row 0 full, the others shorter), with enumerated spans for span heads."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None] < lengths[:, None]
    inputs = {"input_ids": torch.randint(5, 120, (B, T), generator=g) * mask,
              "token_type_ids": (torch.arange(T)[None] >= T // 2).long().expand(B, T) * mask,
              "attention_mask": mask}
    if kind == "span":
        start = torch.randint(1, 3, (B, 5), generator=g).clamp(max=T - 1)
        end = (start + torch.randint(0, 2, (B, 5), generator=g)).clamp(max=T - 1)
        inputs.update(span_start=start, span_end=end,
                      span_width=torch.randint(0, 2, (B, 5), generator=g))
    return inputs


@pytest.mark.parametrize("cfg", [CLASSIC, MODERN], ids=["classic", "modern"])
@pytest.mark.parametrize("kind", ["classification", "pair", "token", "span"])
def test_the_graph_answers_as_torch_at_other_shapes(cfg, kind, tmp_path):
    torch.manual_seed(0)
    model = task_model(cfg, kind, BIO if kind == "token" else ["NULL", "PER", "LOC"], crf=kind == "token",
                       max_span_words=3).eval()
    export_graph(model, kind, 32, tmp_path / FP32)
    head = OnnxHead(tmp_path / FP32, model.crf if kind == "token" else None)
    g = torch.Generator().manual_seed(1)
    for B, T in ((1, 3), (1, 9), (5, 32)):  # not the traced (2, 32); shorter than a window, longer
        inputs = _inputs(kind, B, T, g)
        with torch.no_grad():
            want = model(**inputs)
        got = head(**inputs)
        assert got.shape == want.shape and (got - want).abs().max() < 1e-4, (B, T)
    assert head.crf is (model.crf if kind == "token" else None)  # decoding.predict finds it there
    if cfg.arch == "classic":  # attention as plain products: no NaN guard for ONNX Runtime to run
        ops = {node.op_type for node in onnx.load(tmp_path / FP32).graph.node}
        assert "Softmax" in ops and "IsNaN" not in ops, ops
        assert any(isinstance(m, SelfAttention) for m in model.modules())  # the caller's model as it was


def _reviews(root) -> TaskConfig:
    from components.data.tasks.prepare import prepare_task

    said = [("awful", "neg"), ("good", "pos")]
    rows = ["text,label"] + [f"the film number {i} was {said[i % 2][0]},{said[i % 2][1]}" for i in range(120)]
    (root / "reviews.csv").write_text("\n".join(rows) + "\n")
    task = task_config("classification", "reviews.csv", lr=3e-3, epochs=8)
    prepare_task("reviews", task, root, root / "packages", root / "task")
    return task


def test_finetune_writes_the_graph_and_int8_served_only_where_its_check_passed(tiny_encoder, tmp_path,
                                                                              monkeypatch):
    import mlflow

    from components.lifecycle.inference import load_task_model, predict_rows
    from components.lifecycle.registry import save_pyfunc
    from components.training.finetune import finetune_start

    task = _reviews(tmp_path)
    cfg = section(FinetuneConfig, tasks={"reviews": task}, seeds=[1], init=["pretrained"], batch_size=16,
                  onnx=["pretrained"], workers=1)
    finetune_start("reviews", task, cfg, init="pretrained", task_dir=tmp_path / "task",
                   encoder_dir=tiny_encoder, out_dir=tmp_path / "out")
    model_dir = tmp_path / "out" / "model"
    check = json.loads((model_dir / ONNX_DIR / CHECK).read_text())
    assert check["examples"] == 12 and check["agreement"] >= 0.99 and check["refused"] is None
    assert (model_dir / ONNX_DIR / INT8).exists()

    rows = [{"text": f"the film number {i} was {w}"} for i, w in enumerate(["good", "awful", "fine", "good"])]
    want = predict_rows(load_task_model(model_dir), rows)
    for backend in ("onnx", "onnx-int8"):
        got = predict_rows(load_task_model(model_dir, backend), rows)
        assert [r["label"] for r in got] == [r["label"] for r in want], backend
    fp32 = predict_rows(load_task_model(model_dir, "onnx"), rows)
    assert [r["score"] for r in fp32] == pytest.approx([r["score"] for r in want], abs=1e-5)

    # The pyfunc model serves the backend its load names (bertflow predict --backend does so).
    save_pyfunc(model_dir, "classification", rows[:1], tmp_path / "pyfunc")
    import pandas as pd

    monkeypatch.delenv(BACKEND_ENV, raising=False)
    served = mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))
    assert not isinstance(served.unwrap_python_model().task_model.model, OnnxHead)  # torch, as saved
    served = mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"), model_config={"backend": "onnx-int8"})
    assert isinstance(served.unwrap_python_model().task_model.model, OnnxHead)
    assert [r["label"] for r in served.predict(pd.DataFrame(rows))] == [r["label"] for r in want]
    # ...and the environment's, where set (how `bertflow predict` and `serve-model --backend` pass it).
    monkeypatch.setenv(BACKEND_ENV, "onnx")
    served = mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))
    assert isinstance(served.unwrap_python_model().task_model.model, OnnxHead)

    # Answers that disagree (the fp32 predictions' labels flipped, standing in for an int8 model
    # that answers otherwise): the check refuses, no int8 graph is left, and asking for one says why.
    from components.data.tasks.folder import read_split
    from components.model.decoding import predict
    from components.model.inputs import encode
    from components.model.onnx_model import write_onnx

    tm = load_task_model(model_dir)
    test = encode(read_split(tmp_path / "task", "test"), "classification", tm.tokenizer, tm.info.labels,
                  tm.info.max_seq_len)
    fp32 = predict(tm.model, "classification", test, tm.info.space, 16)
    flipped = [("neg" if label == "pos" else "pos", p) for label, p in fp32]
    shutil.rmtree(model_dir / ONNX_DIR)
    check = write_onnx(tm.model, "classification", tm.info.space, test, flipped, ("accuracy", lambda _: 1.0),
                       tm.info.max_seq_len, model_dir / ONNX_DIR, 16)
    assert check["agreement"] == 0 and not (model_dir / ONNX_DIR / INT8).exists()
    with pytest.raises(ConfigError, match=r"int8 refused: its answers agree with the fp32 model's on 0\.00%"):
        onnx_file(model_dir, "onnx-int8")
    assert onnx_file(model_dir, "onnx") == model_dir / ONNX_DIR / FP32
    with pytest.raises(ConfigError, match="backend 'gpu'"):
        load_task_model(model_dir, "gpu")



# Bad input and damaged files: one clear error, whatever the backend --------------------------------

@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    """A tiny classification model folder with both graphs and a passed int8 check (random
    weights: the errors, not the answers, are under test)."""
    from components.lifecycle.inference import load_task_model
    from components.model.onnx_model import quantize
    from tests.test_serving import tiny_task_model

    model_dir = tiny_task_model(tmp_path_factory.mktemp("onnx"))
    (model_dir / ONNX_DIR).mkdir()
    export_graph(load_task_model(model_dir).model, "classification", 32, model_dir / ONNX_DIR / FP32)
    quantize(model_dir / ONNX_DIR / FP32, model_dir / ONNX_DIR / INT8)
    (model_dir / ONNX_DIR / CHECK).write_text(json.dumps(
        {"examples": 12, "agreement": 1.0, "metric": "accuracy", "fp32": 0.5, "int8": 0.5,
         "metric_drop": 0.0, "refused": None}))
    return model_dir


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_onnx_backends_refuse_bad_rows_as_torch_does(onnx_model, backend):
    from dataclasses import replace

    from components.core.errors import DataError
    from components.lifecycle.inference import load_task_model, predict_rows
    from components.lifecycle.rows import Limits

    model = load_task_model(onnx_model, backend)
    assert isinstance(model.model, OnnxHead)
    assert model.model.path.name == (FP32 if backend == "onnx" else INT8)
    assert len(predict_rows(model, [{"text": "a great film"}])) == 1
    model = replace(model, limits=Limits(max_rows=2, max_text_chars=100))
    for rows, message in (
            ([{"text": "a film"}, {"text": " \t"}], r"^row 1: column 'text' is empty or whitespace only$"),
            ([{"text": 7}], r"^row 0: column 'text' must be a string, got int$"),
            ([{"review": "a film"}], r"^a classification model reads columns \['text'\]; missing \['text'\]"),
            ([{"text": "film " * 30}], r"^row 0: column 'text' holds 150 characters; at most 100 "),
            ([{"text": "a film"}] * 3, r"^3 rows in one call; at most 2 \(BERTFLOW_MAX_ROWS\)")):
        with pytest.raises(DataError, match=message):
            predict_rows(model, rows)


def _broken(onnx_model: Path, tmp_path: Path, damage) -> Path:
    """A copy of the model folder, damaged by `damage(its ONNX folder)`."""
    copy = tmp_path / "model"
    shutil.copytree(onnx_model, copy)
    damage(copy / ONNX_DIR)
    return copy


NO_GRAPH = ("{m}: no ONNX graph (its start was not in finetune.onnx when it was trained); backend torch "
            "serves it")
INCOMPLETE = "(the model's ONNX folder is incomplete)"
DAMAGED = "the model's files are damaged; backend torch serves it"
DAMAGES = {  # what is done to the ONNX folder, and each backend's error (None: it still serves)
    "no ONNX folder": (lambda d: shutil.rmtree(d), {"onnx": NO_GRAPH, "onnx-int8": NO_GRAPH}),
    "fp32 graph missing": (lambda d: (d / FP32).unlink(), {
        "onnx": f"{{m}}/onnx/model.onnx: missing {INCOMPLETE}; backend torch serves it",
        "onnx-int8": None}),  # int8 needs only its own graph
    "int8 graph missing": (lambda d: (d / INT8).unlink(), {
        "onnx": None,
        "onnx-int8": f"{{m}}/onnx/model-int8.onnx: missing, though int8-check.json says its check passed "
                     f"{INCOMPLETE}; backend onnx (fp32) or torch serves it"}),
    "int8 graph and its check missing": (lambda d: ((d / INT8).unlink(), (d / CHECK).unlink()), {
        "onnx-int8": f"{{m}}/onnx/model-int8.onnx: missing, and so is int8-check.json {INCOMPLETE}; "
                     "backend onnx (fp32) or torch serves it"}),
    "int8 check damaged": (lambda d: ((d / INT8).unlink(), (d / CHECK).write_text('{"agreement": 0.9')), {
        "onnx-int8": "{m}/onnx/int8-check.json: not the int8 check's JSON (Expecting ',' delimiter: "
                     "line 1 column 18 (char 17))"}),
    "int8 refused": (lambda d: ((d / INT8).unlink(), (d / CHECK).write_text('{"refused": "why"}')), {
        "onnx-int8": "{m}: int8 refused: why; backend onnx (fp32) or torch serves it"}),
    "fp32 graph cut short": (lambda d: (d / FP32).write_bytes((d / FP32).read_bytes()[:3000]), {
        "onnx": "{m}/onnx/model.onnx: not an ONNX graph ONNX Runtime can read (Protobuf parsing failed): "
                + DAMAGED}),
    "int8 graph overwritten": (lambda d: (d / INT8).write_text("not a graph\n"), {
        "onnx-int8": "{m}/onnx/model-int8.onnx: not an ONNX graph ONNX Runtime can read (Protobuf "
                     "parsing failed): " + DAMAGED}),
    "int8 graph empty": (lambda d: (d / INT8).write_bytes(b""), {
        "onnx-int8": "{m}/onnx/model-int8.onnx: not an ONNX graph ONNX Runtime can read (No graph was "
                     "found in the protobuf): " + DAMAGED}),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_missing_or_damaged_onnx_file_is_one_error_naming_it(onnx_model, tmp_path, damage):
    from components.lifecycle.backends import check_backend
    from components.lifecycle.inference import load_task_model, predict_rows

    how, messages = DAMAGES[damage]
    model_dir = _broken(onnx_model, tmp_path, how)
    for backend, message in messages.items():
        if message is None:  # the other graph still serves
            assert len(predict_rows(load_task_model(model_dir, backend), [{"text": "a film"}])) == 1
            check_backend(model_dir, backend)
            continue
        for load in (load_task_model, check_backend):  # `predict` loads; `serve-model` checks first
            with pytest.raises(ConfigError) as refused:
                load(model_dir, backend)
            assert str(refused.value) == message.format(m=model_dir), (backend, load)


@pytest.mark.parametrize(("kind", "message"), [
    # the tokenizer's ids run past a 6-word vocabulary
    ("classification", r"model\.onnx: ONNX Runtime failed on this graph \(.+\): it does not fit the "
                       r"model; backend torch serves it$"),
    # a span head reads enumerated spans besides
    ("span", r"model\.onnx: the graph reads span_start, span_end, span_width, which this model's inputs "
             r"lack: it is not this model's graph; backend torch serves it$")])
def test_a_graph_of_another_model_is_one_error_naming_it(onnx_model, tmp_path, kind, message):
    from components.lifecycle.inference import load_task_model, predict_rows

    small = encoder_config(6, hidden=16, layers=1, heads=2, intermediate=32, max_position=32)
    other = task_model(small, kind, ["NULL", "PER"] if kind == "span" else ["negative", "positive"],
                       max_span_words=2).eval()
    model_dir = _broken(onnx_model, tmp_path, lambda d: export_graph(other, kind, 32, d / FP32))
    with pytest.raises(ConfigError, match=message):
        predict_rows(load_task_model(model_dir, "onnx"), [{"text": "the movie was great"}])


@pytest.mark.slow
def test_predict_and_serve_model_on_onnx_give_one_error_line_for_bad_input_and_damaged_graphs(
        onnx_model, tmp_path):
    from components.lifecycle.registry import save_pyfunc
    from tests.conftest import run_cli, small_params, write_params
    from tests.test_lifecycle import _free_port

    project = tmp_path / "project"
    write_params(project, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    model = project / "data" / "m"
    save_pyfunc(onnx_model, "classification", [{"text": "a great film"}], model)
    (project / "nocol.csv").write_text("review\na film\n")
    (project / "pair.jsonl").write_text('{"text": "good", "text_b": "bad"}\n{"text": "fine"}\n')
    (project / "long.jsonl").write_text('{"text": "fine"}\n{"text": "a rather long review"}\n')
    trusted = ["--model", str(model), "--trust-model"]

    def one_line(*args: str) -> str:
        proc = run_cli("bertflow", *args, cwd=project, check=False, env={"BERTFLOW_MAX_TEXT_CHARS": "10"})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr)
        return lines[0]

    # The input is checked as on torch (each backend's rows are tested above, in-process).
    ok = run_cli("bertflow", "predict", "reviews", *trusted, "--backend", "onnx-int8", "--text", "a film",
                 cwd=project)
    assert json.loads(ok.stdout)["label"] in ("negative", "positive")
    cases = {"nocol.csv": "error: nocol.csv: missing column 'text' (the model reads 'text'; the input has "
                          "'review')",
             "pair.jsonl": "error: pair.jsonl, line 1: unknown column 'text_b' (the model reads 'text'; the "
                           "input has 'text', 'text_b')",
             "long.jsonl": "error: long.jsonl, line 2: column 'text' holds 20 characters; at most 10 "
                           "(BERTFLOW_MAX_TEXT_CHARS)"}
    for name, expected in cases.items():
        assert one_line("predict", "reviews", *trusted, "--backend", "onnx-int8", "--file", name) == expected
    # A damaged graph: `predict` and `serve-model` say so in one line; no server starts.
    graph = model / "artifacts" / "model" / ONNX_DIR / INT8
    graph.write_text("not a graph\n")
    for command in (["predict", "reviews", "--text", "a film"],
                    ["serve-model", "reviews", "--port", str(_free_port())]):
        assert one_line(*command, *trusted, "--backend", "onnx-int8") == (
            f"error: {graph}: not an ONNX graph ONNX Runtime can read (Protobuf parsing failed): the model's "
            "files are damaged; backend torch serves it")
