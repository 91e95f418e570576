"""Experiments: the runs behind a choice in the params files (pretraining recipe, architecture,
distillation settings, window length, tag decoding, int8 recipe), scored on validation."""
