"""Floor 1: the data stages (ingest, clean, tokenizer, pairs, task data), the text and tag
primitives they share, and the Great Expectations suites of their data contracts."""
