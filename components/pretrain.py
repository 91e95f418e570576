"""Stage `pretrain`: masked LM + NSP with Lightning, from the pairs shards to an HF-layout export.

Data: `PairBatches` streams the Parquet row groups of the pairs shards in a seeded block-shuffled
order (a few row groups in memory at a time), pads each batch to its longest row and masks it.
Everything about batch g (its rows, its masks) is a pure function of (seed, g), and dropout is
reseeded from (seed, rank, step) at every step, so a run resumed from a checkpoint follows the
same trajectory as one that never stopped: the only state is Lightning's global step.
Under DDP, rank r takes global batches g = r, r + world, r + 2*world, ...

Export (`out_dir`): model.safetensors + config.json in the layout of transformers'
BertForPreTraining, the tokenizer files, and bertflow.json (our config and the final metrics).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset

from components import progress
from components.config import ModelConfig, PretrainConfig
from components.errors import ConfigError, DataError
from components.io import atomic_dir, atomic_file, list_shards, write_json
from components.masking import Masker, MaskingSpec
from components.model import BertConfig, build_model, hf_config, hf_state_dict
from components.tokenizer import MASK, SPECIAL_TOKENS

log = logging.getLogger(__name__)


def mix(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


# ----------------------------------------------------------------------------- data

@dataclass(frozen=True)
class Block:
    """One Parquet row group of a pairs shard."""

    path: str
    row_group: int
    rows: int
    first_id: int  # global instance id of its first row


def list_blocks(folder: Path) -> list[Block]:
    """Every row group of the shards in `folder`, in order, with global instance ids."""
    blocks, first = [], 0
    for path in list_shards(folder):
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            rows = meta.row_group(rg).num_rows
            blocks.append(Block(str(path), rg, rows, first))
            first += rows
    return blocks


class PairBatches(IterableDataset):
    """Masked, padded batches of pretraining instances, streamed from the pairs shards.

    Training streams are endless (epoch after epoch; `max_steps` ends training) and define no
    `__len__`, so Lightning never restarts the iterator, which would replay the data from the
    position it was created at.
    """

    def __init__(self, folder: Path, batch_size: int, masker: Masker, seed: int, *,
                 rank: int = 0, world: int = 1, start_batch: int = 0, shuffle: bool = True,
                 epochs: int | None = None, window: int = 4, static_masks: bool = False,
                 short_len: int = 0, short_batches: int = 0):
        self.blocks = list_blocks(folder)
        if not self.blocks:
            raise DataError(f"pretrain: no pairs shards in {folder}; run the pairs stage first")
        self.batch_size, self.masker, self.seed = batch_size, masker, seed
        self.rank, self.world, self.start_batch = rank, world, start_batch
        self.shuffle, self.epochs, self.window, self.static = shuffle, epochs, window, static_masks
        # Curriculum: this rank's first `short_batches` batches are cut into `short_len` pieces.
        self.short_len, self.short_batches = short_len, short_batches
        rows = sum(b.rows for b in self.blocks)
        # Every rank takes the same number of batches per epoch; the remainder is dropped.
        self.per_epoch = rows // batch_size // world * world
        if self.per_epoch == 0:
            raise DataError(f"pretrain: {rows} instances in {folder} are fewer than one batch of "
                            f"{batch_size} per device x {world} devices; lower pretrain.batch_size")

    def _windows(self, epoch: int) -> list[list[Block]]:
        order = (np.random.default_rng(mix(self.seed, epoch)).permutation(len(self.blocks))
                 if self.shuffle else np.arange(len(self.blocks)))
        blocks = [self.blocks[i] for i in order]
        return [blocks[i:i + self.window] for i in range(0, len(blocks), self.window)]

    def _rows(self, window: list[Block], epoch: int, index: int) -> pa.Table:
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
            extra["position_ids"] = torch.arange(T + pad).repeat(B).reshape(-1, L)[keep]
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


def masking_spec(cfg: PretrainConfig, tokenizer_dir: Path, pairs_dir: Path | None = None) -> MaskingSpec:
    """The masker's view of the vocabulary ([MASK] id, specials, `##` pieces, frequencies)."""
    from components.tokenizer import load

    tok = load(tokenizer_dir)
    vocab = tok.get_vocab()
    V = tok.get_vocab_size()
    continuation = torch.zeros(V, dtype=torch.bool)
    for token, i in vocab.items():
        continuation[i] = token.startswith("##")
    unigram = None
    if cfg.random_token == "unigram" and pairs_dir is not None:
        unigram = torch.zeros(V, dtype=torch.float64)
        for block in list_blocks(pairs_dir)[:16]:  # a bounded sample is plenty for frequencies
            ids = pq.ParquetFile(block.path).read_row_group(block.row_group)["input_ids"]
            unigram += torch.bincount(torch.from_numpy(ids.combine_chunks().flatten().to_numpy()
                                                       .astype(np.int64)), minlength=V).double()
    return MaskingSpec(
        vocab_size=V, mask_id=vocab[MASK], special_ids=[vocab[t] for t in SPECIAL_TOKENS],
        continuation=continuation, probability=cfg.mlm_probability,
        max_predictions=cfg.max_predictions_per_seq, unit=cfg.masking, unigram=unigram)


# ----------------------------------------------------------------------------- training

def bert_config(model: ModelConfig, vocab_size: int, cfg: PretrainConfig) -> BertConfig:
    """Our BertConfig from the params' model section, the real vocabulary and the objective."""
    if model.preset not in model.presets:
        raise ConfigError(f"model.preset={model.preset!r} is not one of {sorted(model.presets)}")
    size = model.presets[model.preset]
    return BertConfig(vocab_size=vocab_size, hidden=size.hidden, layers=size.layers,
                      heads=size.heads, intermediate=size.intermediate,
                      max_position=model.max_position, dropout=cfg.dropout, norm=model.norm,
                      sbo=cfg.masking == "span" and cfg.span_boundary_objective,
                      position_init=cfg.position_init)


def lr_lambda(warmup: int, total: int):
    """Linear warmup to the peak, then linear decay to zero at `total` steps."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def _lightning_module(model_cfg: BertConfig, cfg: PretrainConfig, start=None, fresh: tuple[str, ...] = ()):
    """The Lightning module around `start` (a checkpoint's model whose heads `fresh` are new)
    or around a newly initialised model."""
    import lightning as L

    class PretrainModule(L.LightningModule):
        """MLM + NSP (+ SBO) training step, held-out evaluation, AdamW with warmup/decay."""

        def __init__(self) -> None:
            super().__init__()
            self.model = start if start is not None else build_model(model_cfg)
            self._val: dict[str, float] = {}
            self._tick: tuple[float, int] | None = None
            self.tokens_seen = 0
            self.history: list[dict] = []  # held-out metrics at each evaluation
            self.ddp_overlap: int | None = None  # instances both ranks saw in the first step

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            # Dropout draws depend only on (seed, rank, step): resume-exact.
            torch.manual_seed(mix(cfg.seed, self.global_rank, self.global_step, batch_idx))
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
            now = time.perf_counter()
            if self._tick is not None and self.global_step > self._tick[1]:
                stats["train/tokens_per_s"] = tokens / max(now - self._tick[0], 1e-9)
            self._tick = (now, self.global_step)
            self.log_dict(stats, prog_bar=False)
            if self.global_step == 0 and batch_idx == 0 and self.trainer.world_size > 1:
                seen = self.all_gather(batch["instance_id"])  # (world, B)
                self.ddp_overlap = len(set(seen[0].tolist()) & set(seen[1].tolist()))
            return out["loss"]

        def on_before_optimizer_step(self, optimizer) -> None:
            # Head warm-up: only the heads a checkpoint lacked learn; AdamW skips a parameter
            # without a gradient (no update, no weight decay), so the encoder stays as it came.
            if self.global_step < cfg.head_warmup_steps:
                for name, p in self.model.named_parameters():
                    if name.split(".")[0] not in fresh:
                        p.grad = None

        def on_validation_epoch_start(self) -> None:
            self._val = {"correct": 0.0, "total": 0.0, "loss": 0.0, "nsp_correct": 0.0,
                         "nsp_total": 0.0}

        def validation_step(self, batch: dict, batch_idx: int) -> None:
            out = self.model(**{k: v for k, v in batch.items() if k != "instance_id"})
            n = out["mlm_targets"].numel()
            self._val["correct"] += float((out["mlm_logits"].argmax(-1) == out["mlm_targets"]).sum())
            self._val["total"] += n
            self._val["loss"] += float(out["mlm_loss"]) * n
            if "nsp_logits" in out:
                labels = batch["next_sentence_label"]
                self._val["nsp_correct"] += float((out["nsp_logits"].argmax(-1) == labels).sum())
                self._val["nsp_total"] += float((labels >= 0).sum())

        def on_validation_epoch_end(self) -> None:
            v = {k: torch.tensor(x) for k, x in self._val.items()}
            v = {k: float(self.trainer.strategy.reduce(t, reduce_op="sum")) for k, t in v.items()}
            if v["total"]:
                loss = v["loss"] / v["total"]
                metrics = {"val/mlm_accuracy": v["correct"] / v["total"], "val/mlm_loss": loss,
                           "val/perplexity": math.exp(min(loss, 50))}
                if v["nsp_total"]:
                    metrics["val/nsp_accuracy"] = v["nsp_correct"] / v["nsp_total"]
                self.log_dict(metrics)
                self.history.append({"step": self.global_step, "tokens": self.tokens_seen, **metrics})

        def configure_optimizers(self):
            decay, no_decay = [], []
            for p in self.model.parameters():
                # BERT: no weight decay on biases and LayerNorm parameters (the 1-d ones).
                (no_decay if p.ndim < 2 else decay).append(p)
            optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": cfg.weight_decay},
                 {"params": no_decay, "weight_decay": 0.0}],
                lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-6)
            schedule = lr_lambda(cfg.warmup_steps, cfg.max_steps)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        def on_save_checkpoint(self, checkpoint: dict) -> None:
            checkpoint["bertflow"] = {"history": self.history, "tokens_seen": self.tokens_seen}

        def on_load_checkpoint(self, checkpoint: dict) -> None:
            state = checkpoint.get("bertflow", {})
            self.history = state.get("history", [])
            self.tokens_seen = state.get("tokens_seen", 0)

    return PretrainModule()


def _accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) == targets).float().mean() if targets.numel() else torch.tensor(0.0)


def resolve_precision(precision: str) -> str:
    """`auto`: bf16 mixed precision on CUDA, fp32 on CPU (bf16 is ~100x slower on these CPUs)."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"


def run_fingerprint(model_cfg: BertConfig, cfg: PretrainConfig, pairs_dir: Path, tokenizer_dir: Path,
                    start: dict) -> str:
    """Identity of a training run: checkpoints are reused only by the run they belong to."""
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps([asdict(model_cfg), asdict(cfg), start], sort_keys=True).encode())
    h.update((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    for split in ("train", "heldout"):
        for path in list_shards(Path(pairs_dir) / split):
            h.update(f"{split}/{path.name}:{path.stat().st_size}".encode())
    return h.hexdigest()


def checked_checkpoint(path: Path) -> Path:
    """`path` if it is a checkpoint this code can resume from, safely: else a clear error.

    Checkpoints live in the project's own work folder, keyed by the run's fingerprint; one that
    does not load as weights only (damaged, or holding pickled objects) is refused, not run.
    """
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" not in str(e):  # torch names the class it refused: else the file is damaged
            raise DataError(f"pretrain: cannot resume from {path}, it is damaged (not a torch "
                            f"checkpoint); delete it to start pretraining over") from None
        raise DataError(f"pretrain: refusing to resume from {path}: it holds pickled objects "
                        f"beyond weights, which could run code when loaded; delete it to start "
                        f"pretraining over") from None
    except Exception as e:  # noqa: BLE001 - damaged in any way means the same to the user
        raise DataError(f"pretrain: cannot resume from {path}, it is damaged ({type(e).__name__}: "
                        f"{str(e).splitlines()[0]}); delete it to start pretraining over") from None
    if not isinstance(state, dict) or "state_dict" not in state or "bertflow" not in state:
        raise DataError(f"pretrain: {path} is not a checkpoint of this pipeline's pretraining; "
                        f"delete it to start pretraining over")
    log.info("pretrain: resuming from %s (step %s)", path, state.get("global_step"))
    return path


def start_config(model: ModelConfig, cfg: PretrainConfig, vocab_size: int, checkpoint: dict) -> BertConfig:
    """The shape to train: model.preset's, or the imported checkpoint's (bertflow.json of the
    checkpoint stage), whose vocabulary must be the tokenizer's."""
    if not checkpoint["init_from"]:
        return bert_config(model, vocab_size, cfg)
    bert = BertConfig(**checkpoint["config"])
    if bert.vocab_size != vocab_size:
        raise DataError(f"pretrain: the checkpoint {checkpoint['init_from']} has a vocabulary of "
                        f"{bert.vocab_size} but the tokenizer has {vocab_size} tokens; rerun the "
                        f"tokenizer stage, which takes the checkpoint's tokenizer")
    log.info("pretrain: continuing %s (%d layers x %d hidden); model.preset (%s) and "
             "embedding_init do not apply", checkpoint["init_from"], bert.layers, bert.hidden,
             model.preset)
    return replace(bert, dropout=cfg.dropout, sbo=cfg.masking == "span" and cfg.span_boundary_objective)


def pretrain(model: ModelConfig, cfg: PretrainConfig, pairs_dir: Path, tokenizer_dir: Path,
             out_dir: Path, work_dir: Path, checkpoint_dir: Path | None = None,
             mlflow_run: tuple[str, str] | None = None) -> dict:
    """Train (from nothing, or on from the checkpoint stage's output in `checkpoint_dir`),
    resuming from `work_dir`'s last checkpoint of the same run, and export to `out_dir`.

    `mlflow_run` is (tracking URI, run id) of the stage's MLflow run, which Lightning's
    MLFlowLogger writes the curves into.
    """
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from components.checkpoint import load_checkpoint, read_info
    from components.tokenizer import load

    pairs_dir, tokenizer_dir = Path(pairs_dir), Path(tokenizer_dir)
    vocab_size = load(tokenizer_dir).get_vocab_size()
    if cfg.init_from and checkpoint_dir is None:
        raise ConfigError("pretrain.init_from is set: pretraining needs the checkpoint stage's output")
    checkpoint = read_info(checkpoint_dir, cfg.init_from) if checkpoint_dir is not None else {"init_from": ""}
    bert = start_config(model, cfg, vocab_size, checkpoint)
    ckpt_dir = Path(work_dir) / run_fingerprint(bert, cfg, pairs_dir, tokenizer_dir, checkpoint)
    last = ckpt_dir / "last.ckpt"
    resume = checked_checkpoint(last) if last.exists() else None
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    start, fresh = None, []
    if checkpoint["init_from"]:
        start, fresh = load_checkpoint(checkpoint_dir, bert)
        log.info("pretrain: heads the checkpoint %s lacks start fresh: %s%s", checkpoint["init_from"],
                 ", ".join(fresh) or "none", f"; only they train for the first {cfg.head_warmup_steps} "
                 f"steps" if cfg.head_warmup_steps else "")
    module = _lightning_module(bert, cfg, start, tuple(fresh))
    spec = masking_spec(cfg, tokenizer_dir, pairs_dir / "train")
    masker = Masker(spec)
    if cfg.embedding_init == "corpus_svd" and start is None and resume is None:  # else it has weights
        from components.static_vectors import cooccurrence, ppmi_svd

        counts = cooccurrence(pairs_dir / "train", vocab_size, spec.special_ids)
        with torch.no_grad():
            module.model.encoder.embeddings.word.weight.copy_(ppmi_svd(counts, bert.hidden, bert.init_std))
            module.model.encoder.embeddings.word.weight[bert.pad_id].zero_()
        del counts

    loggers = []
    if mlflow_run is not None:
        from lightning.pytorch.loggers import MLFlowLogger

        loggers.append(MLFlowLogger(tracking_uri=mlflow_run[0], run_id=mlflow_run[1]))
    trainer = L.Trainer(
        accelerator=cfg.accelerator, devices=_devices(cfg.devices), num_nodes=cfg.num_nodes,
        strategy=cfg.strategy, precision=resolve_precision(cfg.precision),
        max_steps=cfg.max_steps, max_time={"minutes": cfg.max_minutes},
        gradient_clip_val=cfg.grad_clip, accumulate_grad_batches=cfg.accumulate,
        val_check_interval=cfg.val_every_steps * cfg.accumulate, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, log_every_n_steps=cfg.log_every_steps, logger=loggers or False,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=cfg.checkpoint_every_steps,
                                   save_last=True, save_top_k=0),
                   *([LearningRateMonitor("step")] if loggers else [])],
        enable_progress_bar=progress.enabled(), enable_model_summary=False,
        deterministic=cfg.deterministic,
    )

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            # Called after a checkpoint is restored: start where the restored step left off.
            start = trainer.global_step * cfg.accumulate
            return DataLoader(PairBatches(pairs_dir / "train", cfg.batch_size, masker, cfg.seed,
                                          rank=trainer.global_rank, world=trainer.world_size,
                                          start_batch=start, static_masks=cfg.static_masking,
                                          short_len=cfg.short_seq_len,
                                          short_batches=cfg.short_seq_steps * cfg.accumulate),
                              batch_size=None)

        def val_dataloader(self):
            return DataLoader(PairBatches(pairs_dir / "heldout", cfg.batch_size, masker,
                                          mix(cfg.seed, 1), rank=trainer.global_rank,
                                          world=trainer.world_size, shuffle=False, epochs=1),
                              batch_size=None)

    if start is not None and resume is None:  # where continued pretraining starts from
        trainer.validate(module, datamodule=Data(), verbose=False)
    began = time.perf_counter()
    # weights_only: tensors and plain containers; a checkpoint can't run code when it is read.
    trainer.fit(module, datamodule=Data(), ckpt_path=str(resume) if resume else None,
                weights_only=True)
    minutes = (time.perf_counter() - began) / 60
    # The final evaluation, unless one just ran: at a val_every_steps step, or by Lightning
    # itself when the time budget stopped the run (the last row would be there twice).
    if not module.history or module.history[-1]["step"] != trainer.global_step:
        trainer.validate(module, datamodule=Data(), verbose=False)
    if not trainer.is_global_zero:
        return {}
    history = module.history
    final = history[-1] if history else {}
    stats = {
        "steps": trainer.global_step, "tokens": module.tokens_seen, "minutes_this_run": minutes,
        "resumed": resume is not None, "parameters": sum(p.numel() for p in module.model.parameters()),
        "mlm_accuracy": final.get("val/mlm_accuracy"), "mlm_loss": final.get("val/mlm_loss"),
        "perplexity": final.get("val/perplexity"), "nsp_accuracy": final.get("val/nsp_accuracy"),
        "world_size": trainer.world_size, "precision": resolve_precision(cfg.precision),
    }
    if checkpoint["init_from"]:
        stats.update(init_from=checkpoint["init_from"], fresh_heads=fresh)
        if history and history[0]["step"] == 0:  # the checkpoint as it came, with fresh heads
            stats.update({f"start_{k.split('/')[1]}": v for k, v in history[0].items() if "/" in k})
    if module.ddp_overlap is not None:
        stats["ddp_first_batch_overlap"] = module.ddp_overlap
    stats["baseline_most_frequent_accuracy"] = most_frequent_baseline(pairs_dir, masker, cfg)
    # The export describes the encoder for fine-tuning: with the fine-tuning dropout.
    export(module.model, replace(bert, dropout=model.dropout), tokenizer_dir, out_dir,
           {"stats": stats, "history": history, "init_from": checkpoint["init_from"]})
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # the export is the product; checkpoints were for resuming
    return {**stats, "history": history}


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


def export(model, bert: BertConfig, tokenizer_dir: Path, out_dir: Path, info: dict) -> None:
    """safetensors + config.json (transformers' BertForPreTraining layout) + tokenizer files."""
    from safetensors.torch import save_file

    with atomic_dir(out_dir) as tmp:
        if bert.norm == "post":
            save_file(hf_state_dict(model), tmp / "model.safetensors", metadata={"format": "pt"})
            write_json(tmp / "config.json", hf_config(bert))
        else:  # no HF equivalent: our own names, still safetensors
            save_file({k: v.contiguous() for k, v in model.state_dict().items()
                       if k != "mlm.decoder.weight"}, tmp / "model.safetensors")
        for f in Path(tokenizer_dir).iterdir():
            if f.name not in ("model.safetensors", "config.json", "bertflow.json"):  # tokenizer files only
                shutil.copy(f, tmp / f.name)
        write_json(tmp / "bertflow.json", {"config": asdict(bert), **info})


CURVE_COLUMNS = ("step", "tokens", "val/mlm_accuracy", "val/mlm_loss", "val/perplexity",
                 "val/nsp_accuracy")


def write_curve(history: list[dict], csv_path: Path, png_path: Path) -> None:
    """The held-out curve as CSV (DVC plots) and PNG (for people; DVC's HTML needs a CDN)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header = [c.split("/")[-1] for c in CURVE_COLUMNS]
    rows = [",".join(header)] + [",".join("" if h.get(c) is None else f"{h[c]:.6g}" for c in CURVE_COLUMNS)
                                 for h in history]
    with atomic_file(csv_path) as tmp:
        tmp.write_text("\n".join(rows) + "\n")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [h["tokens"] / 1e6 for h in history]
    left.plot(tokens, [h["val/mlm_accuracy"] for h in history], marker="o", label="MLM accuracy")
    if history and "val/nsp_accuracy" in history[0]:
        left.plot(tokens, [h["val/nsp_accuracy"] for h in history], marker="s", label="NSP accuracy")
    left.set(xlabel="training tokens (M)", ylabel="held-out accuracy", ylim=(0, 1))
    left.legend()
    right.plot(tokens, [h["val/mlm_loss"] for h in history], marker="o")
    right.set(xlabel="training tokens (M)", ylabel="held-out MLM loss")
    fig.tight_layout()
    with atomic_file(png_path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


def _devices(devices: str) -> int | str:
    return int(devices) if devices.isdigit() else devices



