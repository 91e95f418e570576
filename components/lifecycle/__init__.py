"""Floor 5: what happens to a trained model: the registry, inference on raw text (no training
code, no Lightning), the pyfunc model, the transformers export, the report, exploration."""
