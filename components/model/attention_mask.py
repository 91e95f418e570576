"""The boolean masks both encoders hand SDPA (True: may attend): padding, documents packed into
one row, and the sliding window of a modern encoder's local layers.

Shapes: B batch, T sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def documents(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) index of each position's document within its row: a new one wherever the position
    ids do not increase (packed documents restart at 0; training/pretrain_data.py)."""
    restart = position_ids[:, 1:] <= position_ids[:, :-1]  # (B, T - 1)
    return F.pad(restart.long().cumsum(1), (1, 0))


def attention_allowed(T: int, device: torch.device, padding: torch.Tensor | None,
                      position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """Padding keys hidden ((B, 1, 1, T)); with several documents in a row, a (B, 1, T, T)
    block-diagonal mask keeps each within its own. None: every position may attend to all."""
    allowed = None
    if padding is not None and not bool(padding.all()):
        allowed = padding.bool()[:, None, None, :]  # (B, 1, 1, T)
    if position_ids is not None:
        doc = documents(position_ids)
        if bool(doc[:, -1].any()):  # some row holds more than one document
            same = doc[:, None, :, None] == doc[:, None, None, :]  # (B, 1, T, T)
            allowed = same if allowed is None else same & allowed
            # A query always sees itself, so no row is empty (SDPA would give NaN).
            allowed = allowed | torch.eye(T, dtype=torch.bool, device=device)
    return allowed


def windowed(allowed: torch.Tensor | None, window: int, T: int, device: torch.device) -> torch.Tensor | None:
    """`allowed` within the band |i - j| <= window / 2 of a local layer ((.., T, T))."""
    if T - 1 <= window // 2:
        return allowed  # the window covers the whole row
    i = torch.arange(T, device=device)
    band = (i[:, None] - i[None, :]).abs() <= window // 2  # (T, T)
    if allowed is None:
        return band
    # A padding query farther than window/2 from every real token would see nothing: it sees
    # itself (CUDA's memory-efficient kernel gives NaN for an empty row, which spreads). The
    # diagonal as i == j, not torch.eye: ONNX Runtime has no boolean EyeLike.
    return (allowed & band) | (i[:, None] == i[None, :])


def probabilities(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The attention weights (B, heads, T, T) SDPA applies to q, k (B, heads, T, D) under `mask`."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).softmax(-1)
