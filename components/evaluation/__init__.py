"""Floor 3: metrics (pure functions of predictions, so training scores validation with them),
the TF-IDF reference, tables and plots; the evaluate and transfer stages."""
