"""Mixed precision: gradient clipping with the fused AdamW under bf16 autocast (a pair Lightning's
own clipping refuses, so a GPU run with `precision: auto` failed at its first step), in a real
Trainer and through both training stages' own code, on CPU."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from components.core.config import FinetuneConfig, PretrainConfig
from components.training.common import adamw, clip_grad_norm
from tests.conftest import section, task_config


class _Regression(L.LightningModule):
    """A linear regression on large targets (large gradients), with the stages' optimizer and,
    unless `lightning_clips`, their clipping."""

    def __init__(self, lightning_clips: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(16, 4)
        self.lightning_clips = lightning_clips

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return adamw(self.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8,
                     warmup=1, total=5)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.lightning_clips:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        clip_grad_norm(self, optimizer, gradient_clip_val)


def _fit(module: L.LightningModule, precision: str, clip: float) -> list[float]:
    """Fit 5 steps; the global gradient norm the optimizer stepped with, per step (the closure
    computes the gradients inside the step, and they stay until the next one's)."""
    norms: list[float] = []

    def record(optimizer, *_) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    class Record(L.Callback):
        def on_train_start(self, trainer, pl_module):
            trainer.optimizers[0].register_step_post_hook(record)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(40, 16, generator=g), 100 * torch.randn(40, 4, generator=g))
    trainer = L.Trainer(accelerator="cpu", precision=precision, gradient_clip_val=clip, max_steps=5,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Record()])
    trainer.fit(module, DataLoader(data, batch_size=8))
    return norms


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_fused_optimizer_steps_with_gradients_clipped_to_the_norm(precision):
    assert min(_fit(_Regression(), precision, 0)) > 10  # the gradients are far above the clip...
    clipped = _fit(_Regression(), precision, 0.5)
    assert len(clipped) == 5 and max(clipped) <= 0.5 * 1.001  # ...and stepped with at its norm


def test_lightning_alone_refuses_to_clip_for_the_fused_optimizer_under_bf16():
    """Why both training modules clip themselves (if Lightning lifts this, the override can go)."""
    with pytest.raises(RuntimeError, match="fused"):
        _fit(_Regression(lightning_clips=True), "bf16-mixed", 0.5)


def test_both_stages_train_in_bf16_with_clipping(stages_dir, pairs_out, tmp_path):
    from components.core.config import ModelConfig
    from components.data.tasks.prepare import prepare_task
    from components.training.finetune import finetune_start
    from components.training.pretrain import pretrain

    cfg = section(PretrainConfig, precision="bf16-mixed", grad_clip=1.0, max_steps=8, warmup_steps=2,
                  short_seq_steps=0, batch_size=8, val_every_steps=8, accelerator="cpu")
    stats = pretrain(model=section(ModelConfig, preset="tiny"), cfg=cfg, pairs_dir=pairs_out[0],
                     tokenizer_dir=stages_dir / "tokenizer", out_dir=tmp_path / "encoder",
                     work_dir=tmp_path / "snapshots")
    assert (stats["precision"], stats["steps"]) == ("bf16-mixed", 8)

    rows = ["text,label"] + [f"the film number {i} was {'good' if i % 2 else 'awful'},{i % 2}"
                             for i in range(48)]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    task = task_config("classification", "reviews.csv", lr=5e-4, epochs=1)
    prepare_task("reviews", task, tmp_path, tmp_path / "packages", tmp_path / "task")
    tune = section(FinetuneConfig, tasks={"reviews": task}, seeds=[1], init=["pretrained"],
                   precision="bf16-mixed", grad_clip=1.0, min_steps=6, workers=1)
    stats = finetune_start("reviews", task, tune, init="pretrained", task_dir=tmp_path / "task",
                           encoder_dir=tmp_path / "encoder", out_dir=tmp_path / "model")
    assert stats["fits"]["pretrained-s1"]["steps"] >= 6


def test_auto_decides_by_the_flags_and_measures_only_where_they_are_ambiguous():
    from components.training.precision import bf16_speedup, choose, has_amx, has_avx512_bf16

    choice = choose()
    if torch.cuda.is_available():
        assert choice.reason.startswith("CUDA")
    elif has_amx():
        assert choice.precision == "bf16-mixed" and "AMX" in choice.reason
    elif not has_avx512_bf16():
        assert choice.precision == "32-true" and "emulated" in choice.reason
    else:  # this machine's case: avx512_bf16 without AMX, where a product decides
        assert "measured" in choice.reason and 0.1 < bf16_speedup() < 20


def test_a_run_trains_in_one_precision_its_processes_inherit(tmp_path):
    """The first process chooses; the ones it starts (stages, fit workers) take its choice."""
    import os
    import subprocess
    import sys

    from components.training.precision import ENV

    code = ("from components.training.precision import record, resolve_precision; "
            "print(resolve_precision('auto'), record('auto')['precision_rule'], record('32-true'))")
    env = {**os.environ, ENV: "bf16-mixed|chosen by the parent"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 1) == ["bf16-mixed", "chosen by the parent {'precision': '32-true'}\n"]
