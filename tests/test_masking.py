"""Masking statistics on a large sample of real pretraining instances."""

from __future__ import annotations

import pytest
import torch

from components.core.config import PairsConfig, PretrainConfig
from components.core.io import list_shards
from components.data.pairs import make_pairs
from components.model.config import IGNORE
from components.model.masking import Masker, MaskingSpec
from components.training.pretrain_data import masking_spec
from tests.conftest import section

SPECIALS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def real(stages_dir, tmp_path_factory):
    """4,096 real 128-token instances and the masker's view of the real tokenizer."""
    import pyarrow.parquet as pq

    from components.core.config import ExecutorConfig

    out = tmp_path_factory.mktemp("mask-pairs")
    make_pairs(section(PairsConfig, short_seq_prob=0.0), section(ExecutorConfig, kind="serial"),
               stages_dir / "clean",
               stages_dir / "tokenizer", out)
    rows = [r for path in list_shards(out / "train") for r in pq.read_table(path)["input_ids"].to_pylist()
            if len(r) == 128]
    spec = masking_spec(section(PretrainConfig), stages_dir / "tokenizer")
    return torch.tensor(rows[:4096]), spec


def _mask_all(ids, spec, seed=0, batch=64):
    masker, g = Masker(spec), torch.Generator().manual_seed(seed)
    outs = [masker(ids[i:i + batch], g) for i in range(0, len(ids), batch)]
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


@pytest.mark.parametrize("unit", ["token", "whole_word", "span"])
def test_rates_80_10_10_and_no_special_selected(real, unit):
    ids, spec = real
    spec = MaskingSpec(**{**spec.__dict__, "masking": unit})
    out = _mask_all(ids, spec)
    selected = out["mlm_labels"] != IGNORE
    candidates = ~torch.isin(ids, torch.tensor(spec.special_ids))
    assert abs(selected.sum() / candidates.sum() - spec.mlm_probability) <= 0.01
    assert not (selected & ~candidates).any()  # no special token ever selected
    assert torch.equal(out["mlm_labels"][selected], ids[selected])  # labels are the originals
    assert torch.equal(out["input_ids"][~selected], ids[~selected])  # nothing else touched
    masked = (out["input_ids"][selected] == spec.mask_id).float().mean()
    kept = (out["input_ids"][selected] == ids[selected]).float().mean()
    assert abs(masked - 0.8) <= 0.02 and abs(kept - 0.1) <= 0.02 and abs(1 - masked - kept - 0.1) <= 0.02
    assert (selected.sum(1) <= spec.max_predictions_per_seq).all()


@pytest.mark.parametrize("unit", ["whole_word", "span"])
def test_words_stay_whole(real, unit):
    ids, spec = real
    out = _mask_all(ids, MaskingSpec(**{**spec.__dict__, "masking": unit}))
    selected = out["mlm_labels"] != IGNORE
    candidates = ~torch.isin(ids, torch.tensor(spec.special_ids))
    # A `##` piece belongs to the token before it (unless truncation left it after [SEP]).
    piece = spec.continuation[ids] & torch.cat([torch.zeros(len(ids), 1, dtype=torch.bool),
                                                candidates[:, :-1]], 1)
    assert torch.equal(selected[:, 1:][piece[:, 1:]], selected[:, :-1][piece[:, 1:]])
    # 80/10/10 is decided per word or span: a word is never half [MASK] and half visible.
    is_mask = out["input_ids"] == spec.mask_id
    same_word = piece[:, 1:] & selected[:, 1:]
    assert torch.equal(is_mask[:, 1:][same_word], is_mask[:, :-1][same_word])


def test_spans_are_geometric_bounded_and_report_their_boundaries(real):
    ids, spec = real
    out = _mask_all(ids, MaskingSpec(**{**spec.__dict__, "masking": "span"}))
    selected = out["mlm_labels"] != IGNORE
    rows, cols = selected.nonzero(as_tuple=True)
    left, right = out["sbo_left"][rows, cols], out["sbo_right"][rows, cols]
    assert (left < cols).all() and (right > cols).all()
    starts = selected & ~torch.cat([torch.zeros(len(ids), 1, dtype=torch.bool), selected[:, :-1]], 1)
    assert (out["sbo_rel"][starts] == 0).all()
    # Span lengths in words: Geometric(0.2) clipped at 10 has mean ~3.9; budget cuts pull it down.
    words = (selected & ~spec.continuation[ids]).sum()
    spans = int(starts.sum())
    assert 2.0 < words / spans < 4.5


def test_same_seed_same_masks_other_seed_other_masks(real):
    ids, spec = real
    a, b, c = _mask_all(ids[:256], spec, 1), _mask_all(ids[:256], spec, 1), _mask_all(ids[:256], spec, 2)
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], c["input_ids"])


def test_unigram_replacements_follow_the_frequencies(real):
    ids, spec = real
    unigram = torch.zeros(spec.vocab_size, dtype=torch.float64)
    unigram[100], unigram[200] = 3.0, 1.0
    out = _mask_all(ids, MaskingSpec(**{**spec.__dict__, "unigram": unigram}))
    selected = out["mlm_labels"] != IGNORE
    replaced = out["input_ids"][selected & (out["input_ids"] != ids) & (out["input_ids"] != spec.mask_id)]
    share = (replaced == 100).float().mean()
    assert set(replaced.tolist()) <= {100, 200} and abs(share - 0.75) < 0.05


def test_max_predictions_caps_long_rows(real):
    ids, spec = real
    out = _mask_all(ids[:512], MaskingSpec(**{**spec.__dict__, "mlm_probability": 0.5,
                                              "max_predictions_per_seq": 7}))
    assert ((out["mlm_labels"] != IGNORE).sum(1) == 7).all()
