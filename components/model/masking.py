"""Masked-LM masking as a batch transform (dynamic: every batch draws fresh masks).

Selection follows Google's create_masked_lm_predictions: per sequence exactly
`min(max_predictions_per_seq, max(1, round(n * p)))` of its n non-special tokens are selected, by
token, by whole word (`##` pieces go with their word), or by SpanBERT spans (lengths in words
from Geometric(0.2) clipped at 10, until the budget is used). Of the selected units 80% become
[MASK], 10% a random token (uniform, or by unigram frequency), 10% stay; whole words and spans
decide per unit, so a word is never half [MASK] and half kept. Labels sit only at selected
positions (IGNORE elsewhere).

Every batch takes a `torch.Generator` from the caller; seeding it from (seed, step) makes masks
reproducible and a resumed run identical to an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from components.model.config import IGNORE, MAX_SPAN


@dataclass(kw_only=True)
class MaskingSpec:
    """What the masker needs to know about the vocabulary and the objective: the vocabulary's
    from the tokenizer, the objective's from params.yaml's pretrain section
    (training.pretrain_data.masking_spec)."""

    vocab_size: int
    """Vocabulary size V."""
    mask_id: int
    """Id of [MASK]."""
    special_ids: list[int]
    """Ids never selected ([PAD], [CLS], [SEP], [UNK] ...)."""
    continuation: torch.Tensor
    """(V,) bool: True for `##` pieces (word-internal)."""
    mlm_probability: float
    """Share of non-special tokens selected."""
    max_predictions_per_seq: int
    """Cap on selected tokens per sequence."""
    masking: Literal["token", "whole_word", "span"]
    """What is selected: tokens, whole words, or SpanBERT spans."""
    unigram: torch.Tensor | None
    """(V,) token frequencies for random replacements; uniform over non-special ids if None."""
    span_p: float = 0.2
    """Geometric parameter of span lengths (in words), SpanBERT's."""
    max_span: int = MAX_SPAN
    """Longest span, in words."""


class Masker:
    """`Masker(spec)(input_ids, generator)` -> masked ids, labels (and SBO boundaries for spans)."""

    def __init__(self, spec: MaskingSpec):
        self.spec = spec
        self.special = torch.zeros(spec.vocab_size, dtype=torch.bool)
        self.special[spec.special_ids] = True
        weights = (spec.unigram.double().clone() if spec.unigram is not None
                   else torch.ones(spec.vocab_size, dtype=torch.float64))
        weights[self.special] = 0
        self.replacement = weights / weights.sum()  # (V,) distribution of random replacements

    def __call__(self, input_ids: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        spec = self.spec
        candidates = ~self.special[input_ids]  # (B, T)
        budget = (candidates.sum(1).double() * spec.mlm_probability).round().long()
        budget = budget.clamp(min=1, max=spec.max_predictions_per_seq)  # (B,) tokens to select per row
        out: dict[str, torch.Tensor] = {}
        if spec.masking == "span":
            units, out = self._spans(input_ids, candidates, budget, generator)
        else:
            # A unit is a token, or a word (a start token and its following `##` pieces).
            starts = (self._word_starts(input_ids, candidates) if spec.masking == "whole_word"
                      else candidates)
            units = torch.cumsum(starts, dim=1) * candidates  # (B, T) unit number, 0 = none
            units = self._choose_units(units, budget, generator)
        selected = units > 0
        labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE))
        # 80/10/10 per unit: one draw per (row, unit), spread to the unit's tokens.
        B, T = input_ids.shape
        draw = torch.rand(B, T + 1, generator=generator).gather(1, units)  # units <= T
        masked = input_ids.clone()
        to_mask = selected & (draw < 0.8)
        to_random = selected & (draw >= 0.8) & (draw < 0.9)
        masked[to_mask] = spec.mask_id
        n_random = int(to_random.sum())
        if n_random:
            masked[to_random] = torch.multinomial(self.replacement, n_random, replacement=True,
                                                  generator=generator)
        return {"input_ids": masked, "mlm_labels": labels, **out}

    def _word_starts(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(B, T) True where a word starts: a non-`##` token, or a `##` piece whose word was cut
        off by truncation (it follows [CLS]/[SEP]), which must not join the word before it."""
        after_special = torch.ones_like(candidates)
        after_special[:, 1:] = ~candidates[:, :-1]
        return candidates & (~self.spec.continuation[input_ids] | after_special)

    @staticmethod
    def _choose_units(units: torch.Tensor, budget: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Visit units in random order, taking each while the token count stays within budget
        (Google's rule: a unit that would overshoot is skipped, later smaller ones may fit)."""
        B, T = units.shape
        n_units = int(units.max()) + 1
        order = torch.rand(B, n_units, generator=generator).argsort(dim=1)  # (B, U) random order
        sizes = torch.zeros(B, n_units, dtype=torch.long).scatter_add_(1, units, torch.ones_like(units))
        sizes[:, 0] = 0  # unit 0 is "not a candidate"
        ranked = sizes.gather(1, order)  # (B, U) sizes in visiting order
        taken = torch.zeros(B, n_units, dtype=torch.bool)
        total = torch.zeros(B, dtype=torch.long)
        for j in range(n_units):  # U <= T; each step is vectorised over the batch
            fits = (ranked[:, j] > 0) & (total + ranked[:, j] <= budget)
            total += torch.where(fits, ranked[:, j], 0)
            taken[torch.arange(B), order[:, j]] = fits
            if bool((total >= budget).all()):
                break
        return torch.where(taken.gather(1, units), units, torch.zeros_like(units))

    def _spans(self, input_ids: torch.Tensor, candidates: torch.Tensor, budget: torch.Tensor,
               generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """SpanBERT: whole-word spans of Geometric(p) words (clipped), anchored at random word
        starts, until the budget; also each selected token's boundary positions and offset."""
        spec = self.spec
        B, T = input_ids.shape
        starts = self._word_starts(input_ids, candidates)
        units = torch.zeros_like(input_ids)
        left = torch.zeros_like(input_ids)
        right = torch.zeros_like(input_ids)
        rel = torch.zeros_like(input_ids)
        for b in range(B):  # a handful of spans per row: plain Python is cheap here
            word_starts = starts[b].nonzero().flatten().tolist()
            if not word_starts:
                continue
            cand = candidates[b].tolist()
            ends = word_starts[1:] + [T]
            # A word runs from its start to the next start (or the end of the candidates).
            word_end = [next((k for k in range(s + 1, e) if not cand[k]), e)
                        for s, e in zip(word_starts, ends, strict=True)]
            used, total, span_no, tries = set(), 0, 0, 0
            while total < int(budget[b]) and tries < 10 * len(word_starts):
                tries += 1
                length = min(spec.max_span, int(torch.empty(1).geometric_(spec.span_p, generator=generator)))
                first = int(torch.randint(len(word_starts), (1,), generator=generator))
                last = first  # extend word by word, never across [SEP] or padding
                while last + 1 < min(first + length, len(word_starts)) and \
                        word_end[last] == word_starts[last + 1]:
                    last += 1
                lo, hi = word_starts[first], word_end[last]  # token range [lo, hi)
                if any(w in used for w in range(first, last + 1)) or total + (hi - lo) > int(budget[b]):
                    continue
                span_no += 1
                used.update(range(first, last + 1))
                total += hi - lo
                units[b, lo:hi] = span_no
                left[b, lo:hi] = lo - 1
                right[b, lo:hi] = hi
                rel[b, lo:hi] = torch.arange(hi - lo).clamp(max=spec.max_span - 1)
        return units, {"sbo_left": left, "sbo_right": right.clamp(max=T - 1), "sbo_rel": rel}
