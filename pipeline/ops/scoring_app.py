"""The ASGI app `bertflow serve-model` runs under uvicorn: MLflow's own scoring server
(/invocations, /ping, /health, /version) for the model MLflow's serving variable names, its
input checked for the columns the model reads (KnownColumns), behind BodyLimit
(BERTFLOW_MAX_BODY_BYTES, JSON nesting). Importing this module loads the model."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import scoring_server

from components.lifecycle.rows import column_problem
from pipeline.ops.body_limit import MAX_BODY_ENV, BodyLimit


class KnownColumns:
    """A pyfunc model as the scoring server calls it, refusing (400) a request whose columns
    are not those its signature names, missing or unknown: MLflow would drop an unknown one
    with a warning in the server's log only, and answer as if the client's text had been read
    (`text_b` sent to a single-text model). Everything else is the model's."""

    def __init__(self, model: Any) -> None:
        self.model = model
        schema = model.metadata.get_input_schema()
        named = schema is not None and schema.has_input_names()
        self.required = list(schema.required_input_names()) if named else []
        self.optional = list(schema.optional_input_names()) if named else []

    def __getattr__(self, name: str) -> Any:  # metadata and the rest: the model's own
        return getattr(self.model, name)

    def predict(self, data: Any, params: dict | None = None) -> Any:
        """The model's answers, once the input's columns are the model's."""
        columns = list(data.columns) if isinstance(data, pd.DataFrame) else \
            list(data) if isinstance(data, dict) else None
        if columns is not None and (problem := column_problem(columns, self.required, self.optional,
                                                                 strict=True)):
            raise MlflowException(problem, error_code=INVALID_PARAMETER_VALUE)
        return self.model.predict(data, params=params)


app = BodyLimit(scoring_server.init(KnownColumns(scoring_server.load_model_with_mlflow_config(
    os.environ[scoring_server._SERVER_MODEL_PATH]))), int(os.environ[MAX_BODY_ENV]))
