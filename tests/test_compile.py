"""The compiled training step: the same losses and gradients as the eager one, to rounding, and
`compile: auto` eager where no backend is found."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from components.core.errors import ConfigError
from components.model.build import build_model
from components.model.config import IGNORE
from components.training.compiling import backend_missing, decide, maybe_compile
from tests.conftest import encoder_config, run_cli
from tests.test_pretrain import _project

needs_compiler = pytest.mark.skipif(backend_missing("cpu") is not None, reason="no C++ compiler here")


def _batch(B: int, T: int, share: float, seed: int, vocab: int) -> dict:
    """A packed MLM batch: two documents a row (positions restart), `share` of the tokens masked."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.where(torch.rand(B, T, generator=g) < share, ids, torch.full_like(ids, IGNORE))
    positions = torch.cat([torch.arange(T // 2), torch.arange(T - T // 2)]).expand(B, T)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
            "attention_mask": torch.ones(B, T, dtype=torch.long), "mlm_labels": labels,
            "position_ids": positions.contiguous()}


@needs_compiler
def test_the_compiled_step_gives_the_eager_losses_and_gradients_to_rounding():
    torch.manual_seed(0)
    eager = build_model(encoder_config(300, arch="modern", hidden=32, layers=3, heads=2,
                                       intermediate=48, local_window=8, dropout=0.0)).train()
    compiled = copy.deepcopy(eager)
    assert maybe_compile(compiled, "on", "cpu").compiled
    # Both phases' lengths, and masked counts that change from batch to batch (dynamic N).
    for i, (T, share) in enumerate([(16, 0.3), (16, 0.2), (32, 0.3), (32, 0.4)]):
        batch = _batch(4, T, share, i, 300)
        losses = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = model(**batch)["loss"]
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # exports read the same names
    assert [m._compiled_call_impl is not None for m in compiled.modules()].count(True) == 4  # blocks, head


def test_auto_leaves_cpus_eager_and_on_needs_a_backend(monkeypatch):
    from torch._inductor import config

    assert not decide("off", "cpu").compiled
    choice = decide("auto", "cpu")  # compiled CPU steps measured no faster (RESULTS.md)
    assert not choice.compiled and "eager on CPU" in choice.reason
    model = build_model(encoder_config(300, arch="modern", hidden=32, layers=2, heads=2, intermediate=48))
    maybe_compile(model, "auto", "cpu")
    assert all(m._compiled_call_impl is None for m in model.modules())  # left eager
    monkeypatch.setattr(config.cpp, "cxx", ("no-such-compiler-here",))
    with pytest.raises(ConfigError, match=r"pretrain.compile: on, but torch.compile has no C\+\+ compiler"):
        decide("on", "cpu")


@needs_compiler
def test_the_pretrain_stage_compiled_reaches_the_eager_loss(stages_dir, stream_pairs, tmp_path):
    """Both curriculum phases through Lightning: the stage's held-out loss, compiled or not."""
    stats = {}
    for setting in ("off", "on"):
        project = tmp_path / setting
        params = _project(project, stages_dir, stream_pairs, "modern", max_steps=50, compile=setting,
                          val_every_steps=25, snapshot_every_steps=50)
        run_cli("bertflow", "stage", "pretrain", "-p", str(params), cwd=project)
        stats[setting] = json.loads((project / "metrics" / "pretrain_stats.json").read_text())
    assert stats["on"]["compiled"] and not stats["off"]["compiled"]
    assert stats["on"]["mlm_loss"] == pytest.approx(stats["off"]["mlm_loss"], rel=1e-4)
