"""Floor 2: the encoder and its heads in plain torch, masking, the transformers layout, the
model folders (their typed bertflow.json), checkpoint import, and how task examples are encoded
for a head and its outputs decoded. No Lightning here: serving imports this floor."""
