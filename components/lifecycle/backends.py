"""Where a served task model runs: torch, or its ONNX graph in ONNX Runtime, fp32 or int8
(components.model.onnx_model). Kept free of heavy imports: the CLI's options read it."""

BACKENDS = ("torch", "onnx", "onnx-int8")
BACKEND_ENV = "BERTFLOW_BACKEND"  # the REST server's backend (`bertflow serve-model --backend`)
