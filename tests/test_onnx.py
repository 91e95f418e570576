"""ONNX Runtime serving: each head kind's graph answers as torch does at shapes other than the
traced ones (classic and modern encoders, the CRF decoded outside the graph); finetune.onnx
writes the graph and the int8 check; the int8 model is served only where the check passed, by
the inference path and the pyfunc model alike."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
import torch

from components.core.config import FinetuneConfig, TaskConfig
from components.core.errors import ConfigError
from components.lifecycle.backends import BACKEND_ENV
from components.model.build import task_model
from components.model.config import BertConfig
from components.model.encoder import SelfAttention
from components.model.onnx_model import CHECK, FP32, INT8, ONNX_DIR, OnnxHead, export_graph, onnx_file
from tests.conftest import section

CLASSIC = BertConfig(vocab_size=120, hidden=32, layers=2, heads=2, intermediate=64, max_position=64)
MODERN = BertConfig(vocab_size=120, hidden=32, layers=2, heads=2, intermediate=48, max_position=64,
                    arch="modern", local_window=8, global_every=2, layer_norm_eps=1e-5)
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
    task = TaskConfig(kind="classification", source="reviews.csv")
    prepare_task("reviews", task, root, root / "packages", root / "task")
    return task


def test_finetune_writes_the_graph_and_int8_served_only_where_its_check_passed(tiny_encoder, tmp_path,
                                                                              monkeypatch):
    import mlflow

    from components.lifecycle.inference import load_task_model, predict_rows
    from components.lifecycle.registry import save_pyfunc
    from components.training.finetune import finetune_task

    task = _reviews(tmp_path)
    cfg = section(FinetuneConfig, tasks={"reviews": task}, seeds=[1], init=["pretrained"], lr=3e-3,
                  lr_grid=[], epochs=8, batch_size=16, onnx=True, workers=1)
    finetune_task("reviews", task, cfg, tmp_path / "task", tiny_encoder, tmp_path / "out")
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
