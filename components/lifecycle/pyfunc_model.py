"""The MLflow pyfunc model of a fine-tuned task, logged as code (MLflow's "models from code"):
nothing of ours is pickled. Its artifact `model` is the exported task model folder
(safetensors weights, bertflow.json with config and label map, tokenizer files).

The backend (torch, onnx or onnx-int8: components.model.onnx_model) is the environment's
BERTFLOW_BACKEND where set (how `bertflow predict --backend` and `bertflow serve-model
--backend` reach the model), else the model config's `backend`: torch as saved, or another
given at load (`mlflow.pyfunc.load_model(uri, model_config={"backend": ...})`).

Input: a DataFrame with `text` (classification), `text_a`/`text_b` (pair), or `text` or
`tokens` (token and span tasks). Output: one dict per row (see components.lifecycle.inference).
"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

from components.lifecycle.backends import BACKEND_ENV


class TaskPyfunc(PythonModel):
    """Raw text in, labels with scores, word-level tags or scored spans out."""

    def load_context(self, context) -> None:
        from components.lifecycle.inference import load_task_model

        # (a model registered before backends existed has no model config: torch)
        backend = os.environ.get(BACKEND_ENV) or (context.model_config or {}).get("backend", "torch")
        self.task_model = load_task_model(Path(context.artifacts["model"]), backend)

    # The signature enforces the input schema; the hint only tells MLflow not to re-infer one.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> list[dict]:
        from components.core.errors import DataError
        from components.lifecycle.inference import predict_rows
        from components.lifecycle.rows import check_columns

        batch_size = int((params or {}).get("batch_size", 64))
        try:
            # Schema enforcement drops unknown columns; a token model left with neither `text`
            # nor `tokens` must say so rather than answer nothing.
            check_columns(self.task_model.kind, list(model_input.columns))
            return predict_rows(self.task_model, model_input.to_dict(orient="records"), batch_size)
        except DataError as e:  # bad input: the REST server answers 400 with this message
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(TaskPyfunc())
