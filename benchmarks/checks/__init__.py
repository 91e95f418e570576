"""Checks: whether a path gives the answers or bits it should (int8 against fp32, bertflow's
fine-tuning against transformers' Trainer, the math libraries' code paths, the GPU run)."""
