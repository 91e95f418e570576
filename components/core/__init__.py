"""Floor 0: configuration, errors, atomic I/O, seeds, MLflow tracking, logging, progress and
parallelism: what every stage uses and that knows no stage."""
