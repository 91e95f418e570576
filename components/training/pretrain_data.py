"""The pretraining data stream: masked, padded batches of instances from the pairs shards.

`PairBatches` streams the Parquet row groups of the pairs shards in a seeded shuffled order (a
few row groups in memory at a time), pads each batch to its longest row and masks it.
Everything about global batch g (its rows, its masks) is a pure function of (seed, g), so a run
resumed from a snapshot sees the same batches as one that never stopped. Under DDP, rank r
takes global batches g = r, r + world, r + 2*world, ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset

from components.core.config import PretrainConfig
from components.core.errors import DataError
from components.core.io import list_shards
from components.core.seeds import mix
from components.data.tokenizer import MASK, SPECIAL_TOKENS, load
from components.model.masking import Masker, MaskingSpec


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group of a pairs shard."""

    path: str
    row_group: int
    rows: int
    first_id: int  # global instance id of its first row


def list_row_groups(folder: Path) -> list[RowGroup]:
    """Every row group of the shards in `folder`, in order, with global instance ids."""
    groups, first = [], 0
    for path in list_shards(folder):
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            rows = meta.row_group(rg).num_rows
            groups.append(RowGroup(str(path), rg, rows, first))
            first += rows
    return groups


class PairBatches(IterableDataset):
    """Masked, padded batches of pretraining instances, streamed from the pairs shards.

    Training streams are endless (epoch after epoch; `max_steps` ends training) and define no
    `__len__`, so Lightning never restarts the iterator, which would replay the data from the
    position it was created at.
    """

    def __init__(self, folder: Path, batch_size: int, masker: Masker, seed: int, *,
                 rank: int = 0, world: int = 1, start_batch: int = 0, shuffle: bool = True,
                 epochs: int | None = None, window: int = 4, static_masks: bool = False,
                 short_len: int = 0, short_batches: int = 0, documents_after: int | None = None):
        self.groups = list_row_groups(folder)
        if not self.groups:
            raise DataError(f"pretrain: no pairs shards in {folder}; run the pairs stage first")
        self.batch_size, self.masker, self.seed = batch_size, masker, seed
        self.rank, self.world, self.start_batch = rank, world, start_batch
        self.shuffle, self.epochs, self.window, self.static = shuffle, epochs, window, static_masks
        # Curriculum: this rank's first `short_batches` batches are cut into `short_len` pieces.
        self.short_len, self.short_batches = short_len, short_batches
        # Packed rows (no pair label) hold several documents, each ending in this id ([SEP]):
        # their positions restart after each, which keeps attention within a document.
        self.documents_after = documents_after
        rows = sum(b.rows for b in self.groups)
        # Every rank takes the same number of batches per epoch; the remainder is dropped.
        self.per_epoch = rows // batch_size // world * world
        if self.per_epoch == 0:
            raise DataError(f"pretrain: {rows} instances in {folder} are fewer than one batch of "
                            f"{batch_size} per device x {world} devices; lower pretrain.batch_size")

    def _windows(self, epoch: int) -> list[list[RowGroup]]:
        order = (np.random.default_rng(mix(self.seed, epoch)).permutation(len(self.groups))
                 if self.shuffle else np.arange(len(self.groups)))
        groups = [self.groups[i] for i in order]
        return [groups[i:i + self.window] for i in range(0, len(groups), self.window)]

    def _rows(self, window: list[RowGroup], epoch: int, index: int) -> pa.Table:
        tables = []
        for b in window:
            t = pq.ParquetFile(b.path).read_row_group(b.row_group)
            tables.append(t.append_column("id", pa.array(np.arange(b.first_id, b.first_id + b.rows))))
        table = pa.concat_tables(tables)
        if self.shuffle:
            rng = np.random.default_rng(mix(self.seed, epoch, index))
            table = table.take(rng.permutation(table.num_rows))
        return table

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        g = self.start_batch * self.world + self.rank  # global index of this rank's next batch
        epoch = g // self.per_epoch
        while self.epochs is None or epoch < self.epochs:
            first_row = (g % self.per_epoch) * self.batch_size  # where global batch g starts
            row = 0  # rows of this epoch before the current window
            pending: list[pa.Table] = []
            for index, window in enumerate(self._windows(epoch)):
                n = sum(b.rows for b in window)
                if row + n <= first_row:  # resume: skip whole windows without reading them
                    row += n
                    continue
                table = self._rows(window, epoch, index)
                if row < first_row:
                    table = table.slice(first_row - row)
                    row = first_row
                pending.append(table)
                row += table.num_rows
                buffered = pa.concat_tables(pending)
                start = 0
                while buffered.num_rows - start >= self.batch_size:
                    if g // self.per_epoch != epoch:
                        break
                    if g % self.world == self.rank:
                        yield self._collate(buffered.slice(start, self.batch_size), g)
                    start += self.batch_size
                    g += 1
                pending = [buffered.slice(start)]
                if g // self.per_epoch != epoch:
                    break
            epoch += 1
            g = epoch * self.per_epoch + self.rank

    def _collate(self, table: pa.Table, g: int) -> dict[str, torch.Tensor]:
        ids = table["input_ids"].to_pylist()
        types = table["token_type_ids"].to_pylist()
        T = max(map(len, ids))
        B = len(ids)
        input_ids = torch.zeros(B, T, dtype=torch.long)  # [PAD] is id 0
        token_types = torch.zeros(B, T, dtype=torch.long)
        attention = torch.zeros(B, T, dtype=torch.bool)
        for i, (row, tt) in enumerate(zip(ids, types, strict=True)):
            input_ids[i, :len(row)] = torch.tensor(row)
            token_types[i, :len(tt)] = torch.tensor(tt)
            attention[i, :len(row)] = True
        instance = torch.tensor(table["id"].to_numpy(), dtype=torch.long)
        labels = torch.tensor(table["next_sentence_label"].to_numpy(), dtype=torch.long)
        extra: dict[str, torch.Tensor] = {}
        positions = None
        if self.documents_after is not None and bool((labels < 0).any()):
            positions = document_positions(input_ids, self.documents_after, labels < 0)
            extra["position_ids"] = positions
        if self.short_len and g // self.world < self.short_batches:
            # (B, T) -> (B * T/L, L) pieces; all-padding pieces dropped; NSP off (-1): a piece
            # is no sentence pair. A neighbour is 1/L of an early, near-uniform attention mix
            # instead of 1/T: the signal that teaches attention to look nearby is T/L stronger.
            L = self.short_len
            pad = (-T) % L
            split = [torch.nn.functional.pad(x, (0, pad)).reshape(-1, L)
                     for x in (input_ids, token_types, attention.long())]
            keep = split[2].any(1)
            input_ids, token_types, attention = (x[keep] for x in split)
            attention = attention.bool()
            # Each piece keeps the positions it had in its instance: all position embeddings
            # train from the start, and the switch to full length changes nothing for them.
            whole = torch.arange(T + pad).repeat(B, 1) if positions is None else \
                torch.nn.functional.pad(positions, (0, pad))
            extra["position_ids"] = whole.reshape(-1, L)[keep]
            instance = instance.repeat_interleave((T + pad) // L)[keep]
            labels = torch.full((len(input_ids),), -1, dtype=torch.long)
            B = len(input_ids)
        if self.static:  # Google's static masks: fixed per instance, whatever the epoch
            parts = [self.masker(input_ids[i:i + 1], torch.Generator().manual_seed(
                mix(self.seed, int(instance[i])))) for i in range(B)]
            masked = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        else:
            masked = self.masker(input_ids, torch.Generator().manual_seed(mix(self.seed, g)))
        return {**masked, **extra, "token_type_ids": token_types, "attention_mask": attention,
                "next_sentence_label": labels, "instance_id": instance}


def document_positions(input_ids: torch.Tensor, sep_id: int, packed: torch.Tensor) -> torch.Tensor:
    """(B, T) position ids that restart at 0 after every [SEP] of the `packed` rows ((B,) bool)
    and count on in the others; the encoders read a restart as a new document
    (model/attention_mask.py)."""
    B, T = input_ids.shape
    index = torch.arange(T).expand(B, T)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[:, 1:] = (input_ids[:, :-1] == sep_id) & packed[:, None]
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def masking_spec(cfg: PretrainConfig, tokenizer_dir: Path, pairs_dir: Path | None = None) -> MaskingSpec:
    """The masker's view of the vocabulary ([MASK] id, specials, `##` pieces, frequencies)."""
    tok = load(tokenizer_dir)
    vocab = tok.get_vocab()
    V = tok.get_vocab_size()
    continuation = torch.zeros(V, dtype=torch.bool)
    for token, i in vocab.items():
        continuation[i] = token.startswith("##")
    unigram = None
    if cfg.random_token == "unigram" and pairs_dir is not None:
        unigram = torch.zeros(V, dtype=torch.float64)
        for group in list_row_groups(pairs_dir)[:16]:  # a bounded sample is plenty for frequencies
            ids = pq.ParquetFile(group.path).read_row_group(group.row_group)["input_ids"]
            unigram += torch.bincount(torch.from_numpy(ids.combine_chunks().flatten().to_numpy()
                                                       .astype(np.int64)), minlength=V).double()
    return MaskingSpec(
        vocab_size=V, mask_id=vocab[MASK], special_ids=[vocab[t] for t in SPECIAL_TOKENS],
        continuation=continuation, mlm_probability=cfg.mlm_probability,
        max_predictions_per_seq=cfg.max_predictions_per_seq, masking=cfg.masking, unigram=unigram)


def most_frequent_baseline(pairs_dir: Path, masker: Masker, cfg: PretrainConfig) -> float:
    """Held-out MLM accuracy of always predicting the most frequent masked token of train."""
    counts = torch.zeros(masker.spec.vocab_size)
    for i, batch in enumerate(PairBatches(pairs_dir / "train", cfg.batch_size, masker, cfg.seed, epochs=1)):
        labels = batch["mlm_labels"]
        counts += torch.bincount(labels[labels >= 0], minlength=len(counts)).float()
        if i == 50:
            break
    top = int(counts.argmax())
    hits = total = 0
    for batch in PairBatches(pairs_dir / "heldout", cfg.batch_size, masker, mix(cfg.seed, 1),
                             shuffle=False, epochs=1):
        labels = batch["mlm_labels"][batch["mlm_labels"] >= 0]
        hits += int((labels == top).sum())
        total += labels.numel()
    return hits / max(total, 1)
