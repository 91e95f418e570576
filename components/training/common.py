"""What pretraining and fine-tuning share: the optimizer (AdamW with BERT's weight-decay groups,
on the linear warmup/decay schedule) and gradient clipping."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def adamw(params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float,
          betas: tuple[float, float], eps: float, warmup: int, total: int) -> dict:
    """The one optimizer of pretraining, adaptation and fine-tuning, as a LightningModule's
    configure_optimizers returns it: AdamW without weight decay on biases and LayerNorm (the
    1-d parameters), as BERT, its rate along linear_schedule (`warmup` steps up to `lr`, then
    down to zero at `total`), stepped per optimiser step.

    torch's fused update (one kernel, CPU and CUDA) rather than its CPU default, a loop over the
    parameters that took a tenth of a fine-tuning step (benchmarks/RESULTS.md, "Optimizer step").
    """
    optimizer = torch.optim.AdamW(decay_groups(params, weight_decay), lr=lr, betas=betas, eps=eps,
                                  fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(warmup, total))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def clip_grad_norm(module, optimizer: torch.optim.Optimizer, max_norm: float | None) -> None:
    """Clip the gradients' global norm to `max_norm` (None or 0: off): what both LightningModules'
    configure_gradient_clipping does. Lightning's own clipping refuses the fused AdamW under
    mixed precision (for fear of fp16's gradient scaler, which the fused step applies itself) and
    refuses FSDP outright. Here bf16 needs nothing, fp16's scaler unscales first (its step then
    skips the fused unscaling), and FSDP clips through its root module, which sees every shard."""
    if not max_norm:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    trainer = module.trainer
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)
    if isinstance(trainer.model, FullyShardedDataParallel):
        trainer.model.clip_grad_norm_(max_norm)
    else:
        # the optimizer's parameters in its order, as Lightning clips: the same float sums
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def decay_groups(params: Iterable[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """AdamW's parameter groups as BERT's: weight decay on the matrices, none on biases and
    LayerNorm (the 1-d parameters)."""
    params = list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor at each step: linear warmup to the peak, then linear decay to
    zero at `total` steps."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor
