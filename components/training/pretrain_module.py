"""Pretraining in Lightning: the module (MLM or RTD + NSP (+ SBO) steps, held-out evaluation,
pretrain's AdamW with warmup and decay) and the data module that streams the pairs shards.

Everything about a step is a pure function of (seed, rank, step): its batch (pretrain_data.py)
and its dropout masks (reseeded here at every step), so a run resumed from a snapshot follows
the same trajectory as one that never stopped: the only state is Lightning's global step.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from components.core.config import PretrainConfig
from components.core.seeds import mix
from components.model.masking import Masker
from components.model.pretraining import BertForPretraining
from components.training.common import adamw, clip_grad_norm
from components.training.pretrain_data import PairBatches


class PretrainModule(L.LightningModule):
    """MLM + NSP (+ SBO) training step, held-out evaluation, AdamW with warmup/decay; with a
    checkpoint's model whose heads `fresh` are new, the encoder can wait while they warm up."""

    def __init__(self, model: BertForPretraining, cfg: PretrainConfig, fresh: tuple[str, ...] = ()):
        super().__init__()
        self.model, self.cfg, self.fresh = model, cfg, fresh
        self._val: dict[str, float] = {}
        self._tick: tuple[float, int] | None = None
        self.tokens_seen = 0
        self.history: list[dict] = []  # held-out metrics at each evaluation
        self.ddp_overlap: int | None = None  # instances both ranks saw in the first step

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # Dropout draws depend only on (seed, rank, step): resume-exact.
        torch.manual_seed(mix(self.cfg.seed, self.global_rank, self.global_step, batch_idx))
        out = self.model(**{k: v for k, v in batch.items() if k != "instance_id"})
        tokens = int(batch["attention_mask"].sum()) * self.trainer.world_size
        self.tokens_seen += tokens
        stats = {"train/loss": out["loss"], "train/mlm_loss": out["mlm_loss"],
                 "train/mlm_accuracy": _accuracy(out["mlm_logits"], out["mlm_targets"]),
                 "train/tokens": float(self.tokens_seen)}
        if "nsp_loss" in out:
            stats["train/nsp_loss"] = out["nsp_loss"]
        if "sbo_loss" in out:
            stats["train/sbo_loss"] = out["sbo_loss"]
        if "rtd_loss" in out:  # ELECTRA: both losses, so a generator that stops learning shows
            stats["train/rtd_loss"] = out["rtd_loss"]
            stats["train/rtd_accuracy"] = ((out["rtd_logits"] > 0) == out["rtd_targets"]).float().mean()
        now = time.perf_counter()
        if self._tick is not None and self.global_step > self._tick[1]:
            stats["train/tokens_per_s"] = tokens / max(now - self._tick[0], 1e-9)
        self._tick = (now, self.global_step)
        self.log_dict(stats, prog_bar=False)
        if self.global_step == 0 and batch_idx == 0 and self.trainer.world_size > 1:
            # In the short-sequence phase the ranks' batches differ in size: gather as objects.
            seen: list[list[int] | None] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(seen, batch["instance_id"].tolist())
            self.ddp_overlap = len(set(seen[0]) & set(seen[1]))
        return out["loss"]

    def on_before_optimizer_step(self, optimizer) -> None:
        # Head warm-up: only the heads a checkpoint lacked learn; AdamW skips a parameter
        # without a gradient (no update, no weight decay), so the encoder stays as it came.
        if self.global_step < self.cfg.head_warmup_steps:
            for name, p in self.model.named_parameters():
                if name.split(".")[0] not in self.fresh:
                    p.grad = None

    def on_validation_epoch_start(self) -> None:
        self._val = {"correct": 0.0, "total": 0.0, "loss": 0.0, "nsp_correct": 0.0,
                     "nsp_total": 0.0, "rtd_correct": 0.0, "rtd_total": 0.0, "replaced": 0.0}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # ELECTRA samples its replacements: the same draws at every evaluation of a batch.
        torch.manual_seed(mix(self.cfg.seed, 1, self.global_rank, batch_idx))
        # Held-out scores are of the fp32 weights, as fine-tuning's are: under bf16 autocast
        # they changed in the 5th digit between a run straight through and one resumed from a
        # snapshot, on the same weights.
        with torch.autocast(self.device.type, enabled=False):
            out = self.model(**{k: v for k, v in batch.items() if k != "instance_id"})
        if "rtd_logits" in out:
            self._val["rtd_correct"] += float(((out["rtd_logits"] > 0) == out["rtd_targets"]).sum())
            self._val["rtd_total"] += out["rtd_targets"].numel()
            self._val["replaced"] += float(out["rtd_targets"].sum())
        n = out["mlm_targets"].numel()
        self._val["correct"] += float((out["mlm_logits"].argmax(-1) == out["mlm_targets"]).sum())
        self._val["total"] += n
        self._val["loss"] += float(out["mlm_loss"]) * n
        if "nsp_logits" in out:
            labels = batch["next_sentence_label"]
            self._val["nsp_correct"] += float((out["nsp_logits"].argmax(-1) == labels).sum())
            self._val["nsp_total"] += float((labels >= 0).sum())

    def on_validation_epoch_end(self) -> None:
        metrics = self._held_out_metrics()
        if metrics:
            self.log_dict(metrics)

    def _held_out_metrics(self) -> dict[str, float]:
        """The evaluation's metrics over every rank, also kept in the history (empty: no data)."""
        v = {k: torch.tensor(x) for k, x in self._val.items()}
        v = {k: float(self.trainer.strategy.reduce(t, reduce_op="sum")) for k, t in v.items()}
        if not v["total"]:
            return {}
        loss = v["loss"] / v["total"]
        metrics = {"val/mlm_accuracy": v["correct"] / v["total"], "val/mlm_loss": loss,
                   "val/perplexity": math.exp(min(loss, 50))}
        if v["nsp_total"]:
            metrics["val/nsp_accuracy"] = v["nsp_correct"] / v["nsp_total"]
        if v["rtd_total"]:  # every real token is judged; `replaced`: how many the generator changed
            metrics["val/rtd_accuracy"] = v["rtd_correct"] / v["rtd_total"]
            metrics["val/replaced_fraction"] = v["replaced"] / v["rtd_total"]
        self.history.append({"step": self.global_step, "tokens": self.tokens_seen, **metrics})
        return metrics

    def on_train_start(self) -> None:
        # A snapshot of a step that is also an evaluation step is written before Lightning
        # evaluates it, and a run resumed from it skips that evaluation: run it here, on the
        # same weights and held-out batches, so the history (and the export) is the
        # uninterrupted run's.
        step, every = self.global_step, self.cfg.val_every_steps
        if step and step % every == 0 and (not self.history or self.history[-1]["step"] != step):
            self.eval()
            self.on_validation_epoch_start()
            with torch.no_grad():
                for i, batch in enumerate(self.trainer.datamodule.val_dataloader()):
                    self.validation_step({k: v.to(self.device) for k, v in batch.items()}, i)
            self._held_out_metrics()
            self.train()

    def configure_optimizers(self):
        cfg = self.cfg
        return adamw(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                     betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, warmup=cfg.warmup_steps, total=cfg.max_steps)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        clip_grad_norm(self, optimizer, gradient_clip_val)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["bertflow"] = {"history": self.history, "tokens_seen": self.tokens_seen}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("bertflow", {})
        self.history = state.get("history", [])
        self.tokens_seen = state.get("tokens_seen", 0)


def _accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) == targets).float().mean() if targets.numel() else torch.tensor(0.0)


class PairsData(L.LightningDataModule):
    """The pairs shards' train and held-out streams, for the trainer it is attached to."""

    def __init__(self, pairs_dir: Path, cfg: PretrainConfig, masker: Masker, sep_id: int):
        super().__init__()
        self.pairs_dir, self.cfg, self.masker = Path(pairs_dir), cfg, masker
        self.documents_after = sep_id if cfg.packed_attention == "within" else None

    def train_dataloader(self) -> DataLoader:
        # Called after a snapshot is restored: start where the restored step left off.
        cfg, trainer = self.cfg, self.trainer
        return DataLoader(PairBatches(self.pairs_dir / "train", cfg.batch_size, self.masker, cfg.seed,
                                      rank=trainer.global_rank, world=trainer.world_size,
                                      start_batch=trainer.global_step * cfg.accumulate,
                                      static_masks=cfg.static_masking, short_len=cfg.short_seq_len,
                                      short_batches=cfg.short_seq_steps * cfg.accumulate,
                                      documents_after=self.documents_after),
                          batch_size=None)

    def val_dataloader(self) -> DataLoader:
        cfg, trainer = self.cfg, self.trainer
        return DataLoader(PairBatches(self.pairs_dir / "heldout", cfg.batch_size, self.masker,
                                      mix(cfg.seed, 1), rank=trainer.global_rank,
                                      world=trainer.world_size, shuffle=False, epochs=1,
                                      documents_after=self.documents_after),
                          batch_size=None)
