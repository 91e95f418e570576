"""Fine-tuning in Lightning: one module for every task kind (the head from model.build, the
loss by kind), scored on the validation split with the test split's metric.

Shapes: B batch, T subword positions, C labels, W words, S enumerated spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from components.core.config import FinetuneConfig
from components.evaluation.metrics import primary_metric, score_predictions
from components.model.arch import arch_of
from components.model.build import task_model
from components.model.config import IGNORE, BertConfig
from components.model.decoding import SPAN_INPUTS, predict, predictions_table, word_emissions
from components.model.folders import load_pretraining_model
from components.model.inputs import Encoded
from components.training.common import adamw, clip_grad_norm


@dataclass(frozen=True, kw_only=True)
class FitSpec:
    """One fit of a task: which init, which seed, and the task's settings."""

    kind: str
    space: list[str]
    init: str  # "pretrained", "scratch", "checkpoint", "adapted" or "distilled"
    seed: int
    epochs: int
    lr: float  # peak learning rate: the task's one rate, or the one its search tries or chose
    max_span_words: int
    span_decoding: str
    tag_decoding: str
    scheme: str  # token tasks: bio or plain (the metric: entity F1 or word accuracy)
    patience: int  # validation passes without improvement before stopping: the task's, else finetune's
    distill: tuple[float, float] | None = None  # the `distilled` start: (temperature, alpha)


def outputs(model: torch.nn.Module, kind: str, batch: dict) -> torch.Tensor:
    """The head's output on one batch: logits (B, C), emissions (B, T, C) or span logits
    (B, S, 1 + labels)."""
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    if kind == "span":
        return model(**inputs, **{k: batch[k] for k in SPAN_INPUTS})
    return model(**inputs)


def gold_loss(model: torch.nn.Module, kind: str, out: torch.Tensor, batch: dict) -> torch.Tensor:
    """The task's loss on the gold labels, given the head's output (rows without gold labels
    carry IGNORE; with a CRF they are left out by `gold`)."""
    if kind in ("classification", "pair"):
        return F.cross_entropy(out, batch["labels"], ignore_index=IGNORE)  # (B, C) vs (B,)
    if kind == "token":
        if model.crf is None:
            return F.cross_entropy(out.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        # The CRF scores word-level paths: first subwords' emissions and the words' tags.
        rows = batch["gold"] if "gold" in batch else torch.ones(len(out), dtype=torch.bool, device=out.device)
        per_word, kept = word_emissions(out[rows], batch["word_first"][rows])
        tags = batch["labels"][rows][torch.arange(len(kept))[:, None], batch["word_first"][rows].clamp(min=0)]
        return model.crf.nll(per_word, tags.clamp(min=0), kept)  # tags (B, W)
    return F.cross_entropy(out.flatten(0, 1), batch["span_labels"].flatten(), ignore_index=IGNORE)


def loss_of(model: torch.nn.Module, kind: str, batch: dict) -> torch.Tensor:
    """The task's training loss on one batch."""
    return gold_loss(model, kind, outputs(model, kind, batch), batch)


def distilled_loss(model: torch.nn.Module, kind: str, batch: dict, temperature: float,
                   alpha: float) -> torch.Tensor:
    """Hinton et al.'s loss: alpha * T^2 * KL(teacher || student), both softened by the
    temperature T, plus (1 - alpha) * the gold loss on the rows that have gold labels (an
    augmented copy carries the soft term only). The KL is per row, per word or per span: the
    units the teacher's targets come in (model.soft_targets); it averages over those with a
    target."""
    out = outputs(model, kind, batch)
    if kind == "token":
        per_word, kept = word_emissions(out.float(), batch["word_first"])  # (B, W, C)
        student = (model.crf.log_marginals(per_word, kept) if model.crf is not None
                   else per_word.log_softmax(-1))
    else:
        student = out.float().log_softmax(-1)  # (B, C) or (B, S, C)
    soft = batch["soft"]  # the teacher's log-probs, NaN where it has none
    has = soft[..., 0].isfinite()
    if kind == "token":
        has = has & kept  # a word the student's truncation cut has no emission
    teacher = (soft[has] / temperature).log_softmax(-1)  # (N, C): N units with a target
    loss = out.new_zeros((), dtype=torch.float32)
    if bool(has.any()):
        kl = F.kl_div((student[has] / temperature).log_softmax(-1), teacher, log_target=True,
                      reduction="batchmean")
        loss = alpha * temperature ** 2 * kl
    if alpha < 1 and bool(batch["gold"].any()):
        loss = loss + (1 - alpha) * gold_loss(model, kind, out, batch)
    return loss


def score(kind: str, space: list[str], predictions: list, gold: pa.Table, scheme: str) -> float:
    """The task's primary metric, computed as evaluate@task computes it on the test split (for
    text tasks and plain tags `space` is the label set)."""
    table = predictions_table(kind, predictions)
    return score_predictions(kind, space, gold, table, scheme)[primary_metric(kind, scheme)]


def load_encoder_weights(model: torch.nn.Module, encoder_dir: Path, cfg: BertConfig) -> None:
    """Copy the pretrained encoder, and what the task's heads start from (BERT's pooler, for
    sentence tasks; ModernBERT's MLM head transform), into a task model.

    The throwaway pretraining model is built on a forked random stream: its initialisation
    would otherwise advance the seed's stream, and a pretrained fit and a fit from scratch of
    the same seed would draw different dropout masks and batch orders.
    """
    with torch.random.fork_rng(devices=[]):
        pretrained = load_pretraining_model(encoder_dir, cfg)
    model.encoder.load_state_dict(pretrained.encoder.state_dict())
    arch_of(cfg).heads_from_pretraining(model, pretrained)


def freeze_all_but_last(model: torch.nn.Module, k: int) -> None:
    """Train only the last k encoder blocks and the head (k = -1: everything trains)."""
    if k < 0:
        return
    encoder = model.encoder
    for p in encoder.embeddings.parameters():
        p.requires_grad = False
    for block in encoder.blocks[: max(0, len(encoder.blocks) - k)]:
        for p in block.parameters():
            p.requires_grad = False


class FinetuneModule(L.LightningModule):
    """One module for all task kinds: the head comes from task_model, the loss from loss_of;
    validation scores the whole split at once (entity F1 is not a batch mean)."""

    def __init__(self, spec: FitSpec, bert: BertConfig, cfg: FinetuneConfig, weights: Path | None,
                 valid: list[Encoded], valid_gold: pa.Table, steps: int):
        super().__init__()
        self.spec, self.cfg, self.valid, self.valid_gold, self.steps = spec, cfg, valid, valid_gold, steps
        self.model = task_model(bert, spec.kind, spec.space, cfg.crf, spec.max_span_words)
        if weights is not None:
            load_encoder_weights(self.model, weights, bert)
            # Only pretrained layers are worth keeping: from scratch always trains them all.
            freeze_all_but_last(self.model, cfg.train_last_k)
        self.history: list[dict] = []
        self._losses: list[float] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.spec.distill is None:
            loss = loss_of(self.model, self.spec.kind, batch)
        else:
            loss = distilled_loss(self.model, self.spec.kind, batch, *self.spec.distill)
        self._losses.append(float(loss.detach()))
        self.log("train/loss", loss, batch_size=len(batch["index"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        pass  # scored as a whole in on_validation_epoch_end

    def on_validation_epoch_end(self) -> None:
        spec = self.spec
        found = predict(self.model, spec.kind, self.valid, spec.space, self.cfg.batch_size * 2,
                        spec.span_decoding, tag_decoding=spec.tag_decoding)
        metric = score(spec.kind, spec.space, found, self.valid_gold, spec.scheme)
        self.model.train()
        self.log("val/metric", metric)
        loss = float(np.mean(self._losses)) if self._losses else float("nan")
        self._losses = []
        self.history.append({"step": self.global_step, "epoch": self.global_step / max(self.steps, 1),
                             "val_metric": metric, "train_loss": loss})

    def configure_optimizers(self):
        cfg, total = self.cfg, self.steps * self.spec.epochs
        return adamw((p for p in self.model.parameters() if p.requires_grad), lr=self.spec.lr,
                     weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                     warmup=max(1, int(total * cfg.warmup_share)), total=total)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        clip_grad_norm(self, optimizer, gradient_clip_val)
