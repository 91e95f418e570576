"""The encoder: padding masks, sparse MLM head, HF parity, pre-norm and SBO options."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from components.model.build import build_model
from components.model.config import IGNORE, BertConfig
from components.model.hf_layout import bert_hf_config, bert_state_dict, load_bert_state_dict
from tests.conftest import encoder_config

CFG = encoder_config(300, hidden=32, layers=2, heads=4, intermediate=64, dropout=0.0)


def _batch(B=3, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CFG.vocab_size, (B, T), generator=g)
    types = torch.zeros_like(ids)
    types[:, T // 2:] = 1
    labels = torch.where(torch.rand(B, T, generator=g) < 0.3, ids, torch.full_like(ids, IGNORE))
    labels[:, 1] = ids[:, 1]  # at least one selected position per row
    return ids, types, labels


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_changes_nothing_in_real_positions(norm):
    torch.manual_seed(0)
    model = build_model(BertConfig(**{**CFG.__dict__, "norm": norm}), head="encoder").eval()
    ids, types, _ = _batch(B=1, T=10)
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    padded_types = torch.cat([types, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).bool()
    with torch.no_grad():
        short = model(ids, types, torch.ones(1, 10, dtype=torch.bool))
        long = model(padded, padded_types, mask)
        unmasked = model(padded, padded_types, torch.ones(1, 16, dtype=torch.bool))
    assert torch.allclose(short, long[:, :10], atol=1e-5)
    assert not torch.allclose(short, unmasked[:, :10], atol=1e-3)  # the mask really matters


def test_sparse_mlm_loss_equals_dense():
    torch.manual_seed(0)
    model = build_model(CFG).eval()
    ids, types, labels = _batch()
    with torch.no_grad():
        out = model(ids, types, torch.ones_like(ids, dtype=torch.bool), labels)
        hidden = model.encoder(ids, types, torch.ones_like(ids, dtype=torch.bool))
        dense = model.mlm.logits(hidden)  # (B, T, V): every position
        dense_loss = F.cross_entropy(dense.view(-1, CFG.vocab_size), labels.view(-1), ignore_index=IGNORE)
    assert torch.allclose(out["mlm_loss"], dense_loss, atol=1e-6)
    assert out["mlm_logits"].shape == (int((labels != IGNORE).sum()), CFG.vocab_size)


def test_logits_equal_transformers_bert_for_pretraining():
    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining

    torch.manual_seed(0)
    ours = build_model(BertConfig(**{**CFG.__dict__, "dropout": 0.1})).eval()
    config = {k: v for k, v in bert_hf_config(ours.cfg).items() if k not in ("architectures", "model_type")}
    hf = BertForPreTraining(HFConfig(**config)).eval()
    missing, unexpected = hf.load_state_dict(bert_state_dict(ours), strict=False)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}  # shared, not stored
    assert unexpected == [] and set(missing) <= tied
    hf.tie_weights()
    ids, types, labels = _batch()
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[0, 12:] = False
    everything = torch.where(attention, ids, torch.full_like(ids, IGNORE))  # predict every real token
    with torch.no_grad():
        out = ours(ids, types, attention, everything, torch.tensor([0, 1, 0]))
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=attention.long())
    assert (out["mlm_logits"] - ref.prediction_logits[attention]).abs().max() <= 1e-4
    assert (out["nsp_logits"] - ref.seq_relationship_logits).abs().max() <= 1e-4
    # And back: HF weights load into our model unchanged.
    again = build_model(ours.cfg)
    load_bert_state_dict(again, bert_state_dict(ours))
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), again.state_dict().values(),
                                                strict=True))


def test_decoder_is_tied_to_the_embeddings():
    model = build_model(CFG)
    assert model.mlm.decoder.weight is model.encoder.embeddings.word.weight


def test_pre_norm_has_no_hf_layout_but_trains():
    model = build_model(BertConfig(**{**CFG.__dict__, "norm": "pre"}))
    with pytest.raises(ValueError, match="post-norm"):
        bert_state_dict(model)
    ids, types, labels = _batch()
    out = model(ids, types, torch.ones_like(ids, dtype=torch.bool), labels, torch.tensor([0, 1, 1]))
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_span_boundary_objective_adds_its_loss():
    model = build_model(BertConfig(**{**CFG.__dict__, "sbo": True}))
    ids, types, _ = _batch(B=2, T=12)
    labels = torch.full_like(ids, IGNORE)
    labels[:, 3:6] = ids[:, 3:6]  # one span of 3 tokens per row, boundaries 2 and 6
    left = torch.full_like(ids, 2)
    right = torch.full_like(ids, 6)
    rel = (torch.arange(12) - 3).clamp(min=0).expand(2, 12).contiguous()
    out = model(ids, types, torch.ones_like(ids, dtype=torch.bool), labels, None, left, right, rel)
    assert torch.allclose(out["loss"], out["mlm_loss"] + out["sbo_loss"])
    out["loss"].backward()
    assert model.sbo.rel.weight.grad is not None


def test_hidden_must_divide_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        encoder_config(10, hidden=30, heads=4)


def test_span_head_scores_each_span_from_its_start_end_pooled_subwords_and_width():
    # The head projects per subword and picks per span; it must equal the classifier applied to
    # each span's own [s_i; e_j; g_ij; width] vector, computed span by span.
    torch.manual_seed(0)
    head = build_model(CFG, head="span", num_labels=3, max_span_words=4).eval()
    ids, types, _ = _batch(B=2, T=12)
    mask = torch.ones_like(ids, dtype=torch.bool)
    start = torch.tensor([[1, 2, 5, 0], [3, 3, 7, 9]])  # (B, S)
    end = torch.tensor([[1, 4, 8, 0], [3, 6, 7, 11]])
    width = torch.tensor([[0, 1, 3, 0], [0, 2, 0, 1]])
    with torch.no_grad():
        got = head(ids, types, mask, start, end, width)  # (B, S, C+1)
        hidden = head.encoder(ids, types, mask)
        for b in range(2):
            for k in range(4):
                i, j = start[b, k], end[b, k]
                inside = hidden[b, i:j + 1]  # the span's subwords
                g = torch.softmax(head.attend(inside).squeeze(-1), 0) @ inside
                vec = torch.cat([head.start(hidden[b, i]), head.end(hidden[b, j]), g,
                                 head.width(width[b, k])])
                assert torch.allclose(got[b, k], head.classifier(vec), atol=1e-5), (b, k)
    assert got.shape == (2, 4, 4)
