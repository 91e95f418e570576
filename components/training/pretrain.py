"""Stage `pretrain`: masked LM (or ELECTRA's replaced-token detection) + the pair objective with
Lightning, from the pairs shards to an encoder folder.

From random weights (model.preset's shape, token embeddings optionally started from corpus
vectors) or on from the checkpoint stage's output. Snapshots (Lightning's resumable files) are
kept per run fingerprint, so a rerun after a crash resumes exactly and never another run's.
Export (`out_dir`, model.folders.write_encoder): transformers' BertForPreTraining layout, the
tokenizer files and bertflow.json (EncoderInfo: our config and the final metrics).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from components.core import progress
from components.core.config import ModelConfig, PretrainConfig
from components.core.errors import ConfigError, DataError
from components.core.guard import make_work, remove_owned
from components.core.io import list_shards
from components.core.machine import cpu_facts
from components.data.tokenizer import SEP, load
from components.model.arch import ARCHS, arch_of
from components.model.build import build_model
from components.model.checkpoint import load_checkpoint
from components.model.config import BertConfig
from components.model.electra import ElectraForPretraining, generator_config
from components.model.folders import write_encoder
from components.model.masking import Masker
from components.model.metadata import CheckpointInfo, EncoderInfo, read_checkpoint_info
from components.training.compiling import maybe_compile
from components.training.precision import record as precision_record
from components.training.precision import resolve_precision
from components.training.pretrain_data import masking_spec, most_frequent_baseline
from components.training.pretrain_module import PairsData, PretrainModule
from components.training.progress_lines import ProgressLines
from components.training.snapshot_io import AtomicCheckpointIO

log = logging.getLogger(__name__)


def bert_config(model: ModelConfig, vocab_size: int, cfg: PretrainConfig) -> BertConfig:
    """Our BertConfig from the params' model section, the real vocabulary and the objective; the
    LayerNorm epsilon is the arch's."""
    size = model.presets[model.preset]
    return BertConfig(vocab_size=vocab_size, hidden=size.hidden, layers=size.layers,
                      heads=size.heads, intermediate=size.intermediate,
                      max_position=model.max_position, dropout=cfg.dropout, norm=model.norm,
                      layer_norm_eps=ARCHS[model.arch].layer_norm_eps,
                      sbo=cfg.masking == "span" and cfg.span_boundary_objective,
                      position_init=cfg.position_init, rtd=cfg.objective == "electra",
                      arch=model.arch, local_window=model.local_window, global_every=model.global_every,
                      rope_base_global=model.rope_base_global, rope_base_local=model.rope_base_local)


def start_config(model: ModelConfig, cfg: PretrainConfig, vocab_size: int,
                 checkpoint: CheckpointInfo) -> BertConfig:
    """The shape to train: model.preset's, or the imported checkpoint's, whose vocabulary must
    be the tokenizer's."""
    if checkpoint.config is None:
        return bert_config(model, vocab_size, cfg)
    bert = checkpoint.config
    if bert.vocab_size != vocab_size:
        raise DataError(f"pretrain: the checkpoint {checkpoint.init_from} has a vocabulary of "
                        f"{bert.vocab_size} but the tokenizer has {vocab_size} tokens; rerun the "
                        f"tokenizer stage, which takes the checkpoint's tokenizer")
    if cfg.objective == "electra" and not arch_of(bert).electra:
        raise DataError(f"pretrain: the checkpoint {checkpoint.init_from} is a {bert.arch} encoder; "
                        "pretrain.objective electra needs a classic (BERT) encoder")
    log.info("pretrain: continuing %s (%d layers x %d hidden); model.preset (%s) and "
             "embedding_init do not apply", checkpoint.init_from, bert.layers, bert.hidden,
             model.preset)
    return replace(bert, dropout=cfg.dropout, sbo=cfg.masking == "span" and cfg.span_boundary_objective,
                   rtd=cfg.objective == "electra")


def run_fingerprint(model_cfg: BertConfig, cfg: PretrainConfig, pairs_dir: Path, tokenizer_dir: Path,
                    start: CheckpointInfo) -> str:
    """Identity of a training run: snapshots are reused only by the run they belong to."""
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps([asdict(model_cfg), cfg.model_dump(), asdict(start)], sort_keys=True).encode())
    h.update((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    for split in ("train", "heldout"):
        for path in list_shards(Path(pairs_dir) / split):
            h.update(f"{split}/{path.name}:{path.stat().st_size}".encode())
    return h.hexdigest()


def checked_snapshot(path: Path) -> Path | None:
    """`path` if it is a snapshot this code can resume from, safely; None (and the file set
    aside, with a warning) if it is damaged, so the run starts over by itself.

    Snapshots live in the project's own work folder, keyed by the run's fingerprint, and are
    written whole or not at all (snapshot_io); one that holds pickled objects beyond weights is
    refused, never loaded: it did not come from this code.
    """
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # torch names the class it refused: else the file is damaged
            raise DataError(f"pretrain: refusing to resume from {path}: it holds pickled objects "
                            f"beyond weights, which could run code when loaded; delete it to start "
                            f"pretraining over") from None
        return _set_aside(path, "not a torch snapshot")
    except Exception as e:  # noqa: BLE001 - damaged in any way means the same to the user
        return _set_aside(path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if not isinstance(state, dict) or "state_dict" not in state or "bertflow" not in state:
        return _set_aside(path, "not a snapshot of this pipeline's pretraining")
    log.info("pretrain: resuming from %s (step %s)", path, state.get("global_step"))
    return path


def _set_aside(path: Path, why: str) -> None:
    """Rename a damaged snapshot to `damaged-last.ckpt` beside it (removed with its folder when
    the run ends), so pretraining starts over instead of failing on it every run."""
    path.replace(path.with_name(f"damaged-{path.name}"))
    log.warning("pretrain: the snapshot %s is damaged (%s); set aside as damaged-%s, starting over",
                path, why, path.name)


def pretrain(*, model: ModelConfig, cfg: PretrainConfig, pairs_dir: Path, tokenizer_dir: Path,
             out_dir: Path, work_dir: Path, checkpoint_dir: Path | None = None,
             start_info: CheckpointInfo | None = None, mlflow_run: tuple[str, str] | None = None) -> dict:
    """Train (from nothing, or on from the checkpoint stage's output in `checkpoint_dir`),
    resuming from `work_dir`'s last snapshot of the same run, and export to `out_dir`.

    `start_info` describes `checkpoint_dir` when it is not the checkpoint stage's output (the
    adapt stage continues an exported encoder). `mlflow_run` is (tracking URI, run id) of the
    stage's MLflow run, which Lightning's MLFlowLogger writes the curves into.
    """
    import lightning as L

    pairs_dir, tokenizer_dir = Path(pairs_dir), Path(tokenizer_dir)
    vocab_size = load(tokenizer_dir).get_vocab_size()
    if cfg.init_from and checkpoint_dir is None:
        raise ConfigError("pretrain.init_from is set: pretraining needs the checkpoint stage's output")
    checkpoint = start_info or (read_checkpoint_info(checkpoint_dir, cfg.init_from)
                                if checkpoint_dir is not None else CheckpointInfo(init_from=""))
    bert = start_config(model, cfg, vocab_size, checkpoint)
    snapshot_dir = Path(work_dir) / run_fingerprint(bert, cfg, pairs_dir, tokenizer_dir, checkpoint)
    last = make_work(snapshot_dir, "pretrain snapshots") / "last.ckpt"
    resume = checked_snapshot(last) if last.exists() else None
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    network, fresh = start_network(bert, cfg, checkpoint, checkpoint_dir)
    compiled = maybe_compile(network, cfg.compile, cfg.accelerator)
    module = PretrainModule(network, cfg, tuple(fresh))
    spec = masking_spec(cfg, tokenizer_dir, pairs_dir / "train")
    masker = Masker(spec)
    if cfg.embedding_init == "corpus_svd" and not checkpoint.init_from and resume is None:
        corpus_embeddings(module.model.encoder, bert, pairs_dir, spec.special_ids)
    trainer = lightning_trainer(cfg, snapshot_dir, mlflow_run)
    data = PairsData(pairs_dir, cfg, masker, load(tokenizer_dir).token_to_id(SEP))
    if checkpoint.init_from and resume is None:  # where continued pretraining starts from
        trainer.validate(module, datamodule=data, verbose=False)
    began = time.perf_counter()
    # weights_only: tensors and plain containers; a snapshot can't run code when it is read.
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None, weights_only=True)
    minutes = (time.perf_counter() - began) / 60
    # The final evaluation, unless one just ran: at a val_every_steps step, or by Lightning
    # itself when the time budget stopped the run (the last row would be there twice).
    if not module.history or module.history[-1]["step"] != trainer.global_step:
        trainer.validate(module, datamodule=data, verbose=False)
    if not trainer.is_global_zero:
        return {}
    encoder = getattr(module.model, "disc", module.model)  # ELECTRA: the discriminator, not the generator
    stats = {**run_stats(trainer, module, encoder, cfg, checkpoint, fresh), **compiled.record()}
    stats["baseline_most_frequent_accuracy"] = most_frequent_baseline(pairs_dir, masker, cfg)
    # The export describes the encoder for fine-tuning: with the fine-tuning dropout.
    write_encoder(encoder, EncoderInfo(replace(bert, dropout=model.dropout), checkpoint.init_from,
                                       stats, module.history), tokenizer_dir, out_dir)
    remove_owned(snapshot_dir)  # the export is the product; snapshots were for resuming
    this_run = {"minutes": minutes, "resumed": int(resume is not None)}
    return {**stats, "history": module.history, "this_run": this_run}


def start_network(bert: BertConfig, cfg: PretrainConfig, checkpoint: CheckpointInfo,
                  checkpoint_dir: Path | None) -> tuple[torch.nn.Module, list[str]]:
    """The network to train, and the heads it starts fresh: the checkpoint's weights or a random
    BertForPretraining, inside ELECTRA's generator/discriminator pair for that objective."""
    fresh: list[str] = []
    if checkpoint.init_from:
        network, fresh = load_checkpoint(checkpoint_dir, bert)
        log.info("pretrain: heads the checkpoint %s lacks start fresh: %s%s", checkpoint.init_from,
                 ", ".join(fresh) or "none", f"; only they train for the first {cfg.head_warmup_steps} "
                 f"steps" if cfg.head_warmup_steps else "")
    else:
        network = build_model(bert)
    if cfg.objective == "electra":  # the generator always starts fresh: only the encoder is exported
        network = ElectraForPretraining(network, generator_config(bert, cfg.generator_fraction),
                                        cfg.rtd_weight)
    return network, fresh


def corpus_embeddings(encoder: torch.nn.Module, bert: BertConfig, pairs_dir: Path,
                      special_ids: list[int]) -> None:
    """Token embeddings from the pairs' co-occurrence counts (PPMI + truncated SVD); [PAD] zero."""
    from components.training.static_vectors import cooccurrence, ppmi_svd

    counts = cooccurrence(pairs_dir / "train", bert.vocab_size, special_ids)
    with torch.no_grad():
        encoder.embeddings.word.weight.copy_(ppmi_svd(counts, bert.hidden, bert.init_std))
        encoder.embeddings.word.weight[bert.pad_id].zero_()


def lightning_trainer(cfg: PretrainConfig, snapshot_dir: Path, mlflow_run: tuple[str, str] | None):
    """Lightning's Trainer for the run: budget, precision, devices, snapshots and the curves."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    loggers = []
    if mlflow_run is not None:
        from lightning.pytorch.loggers import MLFlowLogger

        loggers.append(MLFlowLogger(tracking_uri=mlflow_run[0], run_id=mlflow_run[1]))
    seconds = progress.line_seconds()  # None where a bar draws (a terminal) or progress is off
    return L.Trainer(
        accelerator=cfg.accelerator, devices=_devices(cfg.devices), num_nodes=cfg.num_nodes,
        strategy=cfg.strategy, precision=resolve_precision(cfg.precision),
        max_steps=cfg.max_steps,
        max_time={"minutes": cfg.max_minutes} if cfg.max_minutes else None,
        gradient_clip_val=cfg.grad_clip, accumulate_grad_batches=cfg.accumulate,
        val_check_interval=cfg.val_every_steps * cfg.accumulate, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, log_every_n_steps=cfg.log_every_steps, logger=loggers or False,
        callbacks=[ModelCheckpoint(dirpath=snapshot_dir, every_n_train_steps=cfg.snapshot_every_steps,
                                   save_last=True, save_top_k=0),
                   *([LearningRateMonitor("step")] if loggers else []),
                   *([ProgressLines("pretrain", seconds)] if seconds else [])],
        enable_progress_bar=progress.enabled(), enable_model_summary=False,
        deterministic=cfg.deterministic, plugins=[AtomicCheckpointIO()],
    )


def run_stats(trainer, module: PretrainModule, encoder: torch.nn.Module, cfg: PretrainConfig,
              checkpoint: CheckpointInfo, fresh: list[str]) -> dict:
    """What the run reached. Only what the inputs determine goes into the outputs (the encoder's
    bertflow.json and the DVC metrics file): a rerun on the same inputs writes the same bytes.
    What this execution was like (wall minutes, a resume) goes to MLflow alone, as "this_run"."""
    history = module.history
    final = history[-1] if history else {}
    stopped_by = "max_steps" if trainer.global_step >= cfg.max_steps else "max_minutes"
    if stopped_by == "max_minutes":
        log.warning("pretrain: GUARD FIRED: pretrain.max_minutes (%s) stopped training at step %d "
                    "of %d; this encoder depends on the machine's speed and is not a reference",
                    cfg.max_minutes, trainer.global_step, cfg.max_steps)
    stats = {
        "steps": trainer.global_step, "max_steps": cfg.max_steps, "stopped_by": stopped_by,
        "tokens": module.tokens_seen, "parameters": sum(p.numel() for p in encoder.parameters()),
        "mlm_accuracy": final.get("val/mlm_accuracy"), "mlm_loss": final.get("val/mlm_loss"),
        "perplexity": final.get("val/perplexity"), "nsp_accuracy": final.get("val/nsp_accuracy"),
        **({"objective": "electra", "rtd_accuracy": final.get("val/rtd_accuracy"),
            "replaced_fraction": final.get("val/replaced_fraction"),
            "generator_parameters": sum(p.numel() for p in module.model.gen.parameters())}
           if cfg.objective == "electra" else {}),
        "world_size": trainer.world_size, **precision_record(cfg.precision),
        "machine": cpu_facts(),  # what decides the last bits (docs/reliability.md#reproducibility)
    }
    if checkpoint.init_from:
        stats.update(init_from=checkpoint.init_from, fresh_heads=fresh)
        if history and history[0]["step"] == 0:  # the checkpoint as it came, with fresh heads
            stats.update({f"start_{k.split('/')[1]}": v for k, v in history[0].items() if "/" in k})
    if module.ddp_overlap is not None:
        stats["ddp_first_batch_overlap"] = module.ddp_overlap
    return stats


def _devices(devices: str) -> int | str:
    return int(devices) if devices.isdigit() else devices
