"""The ASGI app `bertflow serve-model` runs under uvicorn: MLflow's own scoring server
(/invocations, /ping, /health, /version) for the model MLflow's serving variable names, behind
BodyLimit (BERTFLOW_MAX_BODY_BYTES). Importing this module loads the model."""

from __future__ import annotations

import os

from mlflow.pyfunc import scoring_server

from pipeline.ops.body_limit import MAX_BODY_ENV, BodyLimit

app = BodyLimit(scoring_server.init(scoring_server.load_model_with_mlflow_config(
    os.environ[scoring_server._SERVER_MODEL_PATH])), int(os.environ[MAX_BODY_ENV]))
