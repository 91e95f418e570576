"""Floor 3: metrics (pure functions of predictions, so training scores validation with them),
the baselines, tables and plots; the evaluate and transfer stages."""
