"""Where a served task model runs: torch, or its ONNX graph in ONNX Runtime, fp32 or int8
(components.model.onnx_model). Kept free of heavy imports: the CLI's options read it."""

from pathlib import Path

BACKENDS = ("torch", "onnx", "onnx-int8")
BACKEND_ENV = "BERTFLOW_BACKEND"  # the REST server's backend (`bertflow serve-model --backend`)
TASK_MODEL = Path("artifacts") / "model"  # the exported task model, inside a saved pyfunc model


def check_backend(model_dir: Path, backend: str) -> None:
    """A ConfigError naming what is wrong when `backend` cannot run the exported task model
    `model_dir`: no graph, an int8 graph its check refused, a graph file missing or damaged.
    `bertflow serve-model` asks before its server starts, which would fail on the same load in
    a traceback; the graph is opened as the server will open it."""
    if backend == "torch":
        return
    from components.model.onnx_model import onnx_file, open_session

    open_session(onnx_file(model_dir, backend))
