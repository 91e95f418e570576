"""A task model for ONNX Runtime: the graph (encoder and head; a CRF's Viterbi decoding stays
outside it, in components.model.decoding), int8 weights by onnxruntime's dynamic quantization,
and the check that decides whether the int8 model may be served: its answers on the task's
test split against the fp32 torch model's. Shapes: B batch, T subword positions, S spans.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from components.core.errors import ConfigError
from components.model.decoding import SPAN_INPUTS
from components.model.encoder import SelfAttention

ONNX_DIR = "onnx"  # inside an exported task model folder
FP32, INT8, CHECK = "model.onnx", "model-int8.onnx", "int8-check.json"
MIN_AGREEMENT, MAX_METRIC_DROP = 0.99, 0.005


def input_names(kind: str) -> tuple[str, ...]:
    """The graph's inputs, in order: the encoder's, and for span tasks the enumerated spans'."""
    return ("input_ids", "token_type_ids", "attention_mask") + (SPAN_INPUTS if kind == "span" else ())


class _Graph(nn.Module):
    """The head's forward with positional inputs, as torch.onnx traces it."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.names = model, input_names(kind)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True)))


class _MatmulAttention(nn.Module):
    """A classic block's attention, the same weights, as plain products with an additive mask.

    SDPA's export guards every softmax row against NaN (an IsNaN and a Where per layer), which
    ONNX Runtime runs as extra passes over (B, heads, T, T); without them the int8 graph answers
    more sentences per second (benchmarks/speed/onnx_attention.py). The answers are the same: a
    hidden key's weight is exp(-10000) = 0 in float32, as with SDPA's -inf. q, k and v are split
    off the last axis and each transposed in 4 dimensions, not permuted as one 5-dimensional
    tensor: ONNX Runtime's int8 graph of a 2 x 384 encoder then answered 10% more sentences."""

    def __init__(self, attention: SelfAttention):
        super().__init__()
        self.qkv, self.out, self.heads = attention.qkv, attention.out, attention.heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        h, d = self.heads, H // self.heads
        q, k, v = self.qkv(x).split(H, dim=-1)  # each (B, T, H)
        q, v = (t.view(B, T, h, d).transpose(1, 2) for t in (q, v))  # (B, heads, T, d)
        k = k.view(B, T, h, d).permute(0, 2, 3, 1)  # (B, heads, d, T)
        scores = q @ k / d ** 0.5  # (B, heads, T, T)
        if mask is not None:  # True where attention may look
            scores = scores + (~mask).to(scores.dtype) * -10000.0
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H))


def _for_export(model: nn.Module) -> nn.Module:
    """A copy of `model` whose classic attention runs as _MatmulAttention (a modern encoder's
    keeps SDPA: its windows and rotary positions are traced as they are)."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, SelfAttention):
                setattr(parent, name, _MatmulAttention(child))
    return model


def export_graph(model: nn.Module, kind: str, max_len: int, out: Path) -> None:
    """The head as ONNX at `out`, with the batch, token and span counts left dynamic.

    The tracer records the branches this example takes: it is as long as the model reads (a
    modern encoder's window band is then in the graph) and padded (so is the padding mask; on an
    unpadded batch the mask hides nothing, the same answer)."""
    B, T, S = 2, max_len, 3
    example = {"input_ids": torch.full((B, T), 5), "token_type_ids": torch.zeros(B, T, dtype=torch.long),
               "attention_mask": torch.arange(T)[None].expand(B, T) < torch.tensor([[T], [T // 2]]),
               "span_start": torch.ones(B, S, dtype=torch.long), "span_end": torch.full((B, S), 2),
               "span_width": torch.ones(B, S, dtype=torch.long)}
    names = input_names(kind)
    axes = {n: {0: "batch", 1: "spans" if n in SPAN_INPUTS else "tokens"} for n in names}
    # The TorchScript exporter: it traces our SDPA masks and RoPE as plain ops. The wrapper is put
    # in eval mode itself: the exporter restores the wrapper's mode afterwards, recursively, and a
    # wrapper left in training mode would switch the caller's model's dropout back on.
    with warnings.catch_warnings():  # the tracer's warnings name the branches the docstring says
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(_Graph(_for_export(model), kind).eval(), tuple(example[n] for n in names), str(out),
                          input_names=list(names), output_names=["scores"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)


def quantize(src: Path, dst: Path) -> None:
    """`src` with its matrix weights in int8 (activations quantized per batch at run time).

    One scale per output column, not one per matrix: a column of small weights keeps its
    precision beside a column of large ones. Only the products are quantized; the embedding
    lookups, which int8 would not speed up, stay fp32. On a classic encoder cut from MiniLM
    this lifted the int8 answers' agreement with fp32 from 98.4% to 99.1% (movie-sentiment's
    test split), and on the MiniLM teacher from 97.2% to 99.3% (benchmarks/experiments/int8_recipe.py).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"])


def _ort_reason(error: Exception) -> str:
    """ONNX Runtime's own words from one of its errors, without its code number and the path
    it repeats ("[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from P failed:Why")."""
    return str(error).rpartition(" : ")[2].rpartition("failed:")[2].strip().rstrip(".")


def _is_ort_error(error: Exception) -> bool:
    """Whether `error` is one of ONNX Runtime's (its classes subclass Exception alone)."""
    return type(error).__module__.startswith("onnxruntime")


def open_session(path: Path):
    """An ONNX Runtime session on the graph at `path`, as many threads as torch's path uses; a
    file ONNX Runtime cannot read (cut short, overwritten, not a graph) is a ConfigError
    naming it, not ONNX Runtime's traceback."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 4  # fatal only: its own log line would repeat the error raised here
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        if not _is_ort_error(e):
            raise
        raise ConfigError(f"{path}: not an ONNX graph ONNX Runtime can read ({_ort_reason(e)}): the "
                          "model's files are damaged; backend torch serves it") from None


class OnnxHead(nn.Module):
    """An ONNX Runtime session in the place of a torch head: decoding.predict calls it as one
    (inputs in, scores out as a torch tensor) and finds the CRF, if any, where a head keeps it."""

    def __init__(self, path: Path, crf: nn.Module | None = None):
        super().__init__()
        self.path = Path(path)
        self.session = open_session(self.path)
        self.crf = crf
        # What the graph reads (a modern encoder has no segment embeddings: no token_type_ids).
        self.names = [i.name for i in self.session.get_inputs()]
        self.register_buffer("device_anchor", torch.empty(0))  # inputs go to the CPU

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        if unknown := [n for n in self.names if n not in inputs]:  # a graph of another task kind
            raise ConfigError(f"{self.path}: the graph reads {', '.join(unknown)}, which this model's "
                              "inputs lack: it is not this model's graph; backend torch serves it")
        feeds = {n: inputs[n].numpy() for n in self.names}
        try:
            return torch.from_numpy(np.asarray(self.session.run(None, feeds)[0]))
        except Exception as e:  # a graph that loads but does not fit the model (another vocabulary)
            if not _is_ort_error(e):
                raise
            raise ConfigError(f"{self.path}: ONNX Runtime failed on this graph ({_ort_reason(e)}): it "
                              "does not fit the model; backend torch serves it") from None


def read_check(folder: Path) -> dict | None:
    """The int8 check's record in an ONNX folder, or None if it has none."""
    path = Path(folder) / CHECK
    if not path.exists():
        return None
    try:
        check = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not the int8 check's JSON ({e})") from None
    if not isinstance(check, dict):
        raise ConfigError(f"{path}: not the int8 check's JSON (a {type(check).__name__}, not an object)")
    return check


def int8_verdict(check: dict) -> str | None:
    """Why the int8 model may not be served (None: it may)."""
    if check["agreement"] < MIN_AGREEMENT:
        return (f"its answers agree with the fp32 model's on {check['agreement']:.2%} of the test "
                f"split's examples (at least {MIN_AGREEMENT:.0%} needed)")
    if check["metric_drop"] > MAX_METRIC_DROP:
        return (f"its test {check['metric']} is {check['metric_drop'] * 100:.2f} points below the "
                f"fp32 model's (at most {MAX_METRIC_DROP * 100:.1f} allowed)")
    return None


def onnx_file(model_dir: Path, backend: str) -> Path:
    """The graph a backend serves from an exported task model, or a ConfigError saying why none:
    a model trained without graphs, an int8 graph its check refused, a file gone missing."""
    folder = Path(model_dir) / ONNX_DIR
    if not folder.is_dir():
        raise ConfigError(f"{model_dir}: no ONNX graph (its start was not in finetune.onnx when it was "
                          "trained); backend torch serves it")
    if backend == "onnx":
        if not (folder / FP32).is_file():
            raise ConfigError(f"{folder / FP32}: missing (the model's ONNX folder is incomplete); "
                              "backend torch serves it")
        return folder / FP32
    if (folder / INT8).is_file():
        return folder / INT8
    check = read_check(folder)
    if check and check.get("refused"):  # the check refused it when the model was trained: say why
        raise ConfigError(f"{model_dir}: int8 refused: {check['refused']}; backend onnx (fp32) or "
                          "torch serves it")
    record = f"though {CHECK} says its check passed" if check else f"and so is {CHECK}"
    raise ConfigError(f"{folder / INT8}: missing, {record} (the model's ONNX folder is incomplete); "
                      "backend onnx (fp32) or torch serves it")


def _answer(kind: str, prediction):
    """What must agree between two models' predictions of one example: the label, the tags,
    or the spans (scores aside)."""
    if kind in ("classification", "pair"):
        return prediction[0]
    return [tuple(s[:3]) for s in prediction] if kind == "span" else prediction


def write_onnx(model: nn.Module, kind: str, space: list[str], test: list, fp32: list,
               metric: tuple[str, Callable[[list], float]], max_len: int, out: Path, batch_size: int,
               **decoding) -> dict:
    """Into `out`: the head's ONNX graph, the check of its int8 twin on the test split (`test`
    encoded, `fp32` the torch model's predictions of it, `metric` the task's name and scorer),
    and the int8 graph itself only if the check passes; returns the check's record."""
    from components.model.decoding import predict

    out.mkdir()
    export_graph(model, kind, max_len, out / FP32)
    quantize(out / FP32, out / INT8)
    int8 = predict(OnnxHead(out / INT8, getattr(model, "crf", None)), kind, test, space, batch_size,
                   **decoding)
    same = [_answer(kind, a) == _answer(kind, b) for a, b in zip(fp32, int8, strict=True)]
    name, scorer = metric
    check = {"examples": len(same), "agreement": sum(same) / len(same), "metric": name,
             "fp32": scorer(fp32), "int8": scorer(int8)}
    check["metric_drop"] = check["fp32"] - check["int8"]
    check["refused"] = int8_verdict(check)
    if check["refused"]:  # not served worse silently: no int8 graph to serve
        (out / INT8).unlink()
    (out / CHECK).write_text(json.dumps(check, indent=1) + "\n")
    return check
