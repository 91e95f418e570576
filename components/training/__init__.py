"""Floor 4: pretraining and fine-tuning with Lightning: data streams, LightningModules, the
optimiser, schedule and precision they share, and the stages that run them."""
