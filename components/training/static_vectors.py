"""Static token vectors learned on the pretraining corpus (PPMI + truncated SVD), to start the
token embeddings from: the count-based route to GloVe-style vectors, in seconds on a CPU.

Co-occurrence counts of token ids within a window over the pairs shards (specials skipped),
positive pointwise mutual information with context smoothing (alpha = 0.75, as word2vec), then
a randomized truncated SVD; row i is U_i * sqrt(S), rescaled to the embedding's init std.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from components.core.io import list_shards


def cooccurrence(folder: Path, vocab_size: int, special_ids: list[int], window: int = 4,
                 max_tokens: int = 20_000_000) -> torch.Tensor:
    """(V, V) float32 symmetric counts of ids at distance 1..window inside each instance."""
    counts = torch.zeros(vocab_size * vocab_size, dtype=torch.float32)
    special = torch.zeros(vocab_size, dtype=torch.bool)
    special[special_ids] = True
    seen = 0
    for path in list_shards(folder):
        column = pq.read_table(path, columns=["input_ids"])["input_ids"].combine_chunks()
        ids = torch.from_numpy(column.flatten().to_numpy().astype(np.int64))
        lengths = torch.from_numpy(pc.list_value_length(column).to_numpy().astype(np.int64))
        row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (N,) instance of each token
        keep = ~special[ids]
        for d in range(1, window + 1):
            a, b = ids[:-d], ids[d:]
            same = (row[:-d] == row[d:]) & keep[:-d] & keep[d:]
            index = a[same] * vocab_size + b[same]
            counts.index_add_(0, index, torch.ones(len(index)))
        seen += len(ids)
        if seen >= max_tokens:
            break
    counts = counts.view(vocab_size, vocab_size)
    return counts + counts.T


def ppmi_svd(counts: torch.Tensor, dim: int, std: float, seed: int = 0) -> torch.Tensor:
    """(V, dim) vectors from co-occurrence counts; rows of unseen tokens are small noise."""
    total = counts.sum()
    rows = counts.sum(1, keepdim=True)
    context = counts.sum(0, keepdim=True) ** 0.75
    pmi = torch.log((counts * context.sum()).clamp(min=1e-12) / (rows * context).clamp(min=1e-12))
    ppmi = torch.where(counts > 0, pmi.clamp(min=0), torch.zeros_like(pmi))
    del pmi
    torch.manual_seed(seed)
    u, s, _ = torch.svd_lowrank(ppmi, q=dim, niter=4)
    vectors = u * s.sqrt()
    vectors = vectors / vectors.std() * std
    unseen = rows.squeeze(1) == 0
    vectors[unseen] = torch.randn(int(unseen.sum()), dim) * std
    return vectors if total > 0 else torch.randn(counts.shape[0], dim) * std
