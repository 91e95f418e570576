"""Stage `adapt@task`: task-adaptive pretraining (Gururangan et al. 2020, "Don't Stop
Pretraining"), the `adapted` start of finetune.init.

The pretrain stage's encoder is continued with masked LM on the task's own training text, its
labels unused, for `adapt.steps` steps, then fine-tuned like the other starts. The texts are
packed into full sequences (RoBERTa's FULL-SENTENCES: examples back to back, a [SEP] between
two; a pair's two texts stay together), written in the pairs stage's contract (no pair
objective) and trained by the pretrain stage's own loop, masking and export. The validation
split's text is the held-out MLM set; the test split is never read.
The stage exists only with `adapted` in finetune.init.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.parquet as pq

from components.core.config import AdaptConfig, ModelConfig, PretrainConfig, TaskConfig
from components.core.errors import DataError
from components.core.guard import make_work, remove_owned
from components.data import validation
from components.data.pairs import pack_documents, to_table, tokenize_documents
from components.data.tasks.folder import read_split
from components.data.tokenizer import CLS, SEP, load
from components.model.metadata import CheckpointInfo, read_encoder_info
from components.training.pretrain import pretrain

log = logging.getLogger(__name__)

START = "pretrained encoder"  # the adapted encoder's init_from: what it continued


def task_documents(task_dir: Path, kind: str, split: str) -> list[list[str]]:
    """A split's texts as documents of sentences: one per example (a pair's two texts, a
    tagged sentence's words joined by spaces)."""
    table = read_split(task_dir, split)
    if kind == "classification":
        return [[t] for t in table["text"].to_pylist()]
    if kind == "pair":
        return [[a, b] for a, b in zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(),
                                       strict=True)]
    return [[" ".join(words)] for words in table["tokens"].to_pylist()]


def write_task_pairs(task_dir: Path, kind: str, encoder_dir: Path, max_seq_len: int, batch_size: int,
                     out: Path) -> dict:
    """Packed MLM sequences of the train (train/) and validation (heldout/) texts, in the
    pairs contract; returns their counts."""
    tok = load(encoder_dir)
    tok.encode_special_tokens = True  # "[SEP]" in a review is text, not a separator
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    counts = {}
    for split, folder in (("train", "train"), ("valid", "heldout")):
        docs = tokenize_documents(tok, task_documents(task_dir, kind, split))
        table = to_table(pack_documents(docs, max_seq_len), cls_id, sep_id)
        if table.num_rows < batch_size:
            raise DataError(f"adapt: the {split} split of {task_dir} packs into {table.num_rows} "
                            f"sequences of {max_seq_len} tokens, fewer than one batch "
                            f"(adapt.batch_size={batch_size}); lower adapt.batch_size")
        (out / folder).mkdir(parents=True)
        path = out / folder / "part-00000.parquet"
        pq.write_table(table, path)
        validation.check_pairs_shard(table, cls_id=cls_id, sep_id=sep_id, vocab_size=tok.get_vocab_size(),
                                     max_seq_len=max_seq_len, nsp=False, where=path)
        counts[folder] = {"sequences": table.num_rows, "documents": len(docs)}
    return counts


def adapt_config(cfg: AdaptConfig, pretrain_cfg: PretrainConfig) -> PretrainConfig:
    """The pretrain settings of the continued run: the pretrain stage's masking and optimiser,
    adapt's budget, rate and warmup, no curriculum (the encoder already reads context)."""
    return pretrain_cfg.model_copy(update=dict(
        init_from=START, head_warmup_steps=0, max_steps=cfg.steps, lr=cfg.lr,
        warmup_steps=int(cfg.steps * cfg.warmup_share),
        batch_size=cfg.batch_size, accumulate=1, short_seq_steps=0, max_minutes=0.0,
        val_every_steps=max(1, cfg.steps // 4), snapshot_every_steps=max(1, cfg.steps // 4)))


def adapt_task(cfg: AdaptConfig, task: TaskConfig, model: ModelConfig, pretrain_cfg: PretrainConfig,
               task_dir: Path, encoder_dir: Path, out_dir: Path, work_dir: Path,
               mlflow_run: tuple[str, str] | None = None) -> dict:
    """The encoder in `encoder_dir` continued on the task's text, exported to `out_dir` (an
    encoder folder)."""
    encoder = read_encoder_info(encoder_dir)
    pairs = Path(work_dir) / "pairs"
    remove_owned(pairs)  # left by a killed run
    make_work(pairs, "adapt's work folder")
    counts = write_task_pairs(task_dir, task.kind, encoder_dir, cfg.max_seq_len, cfg.batch_size, pairs)
    log.info("adapt: %d sequences of the train split's text, %d of validation's; %d steps at lr %g",
             counts["train"]["sequences"], counts["heldout"]["sequences"], cfg.steps, cfg.lr)
    stats = pretrain(model=model, cfg=adapt_config(cfg, pretrain_cfg), pairs_dir=pairs,
                     tokenizer_dir=encoder_dir,
                     out_dir=out_dir, work_dir=work_dir, checkpoint_dir=encoder_dir, mlflow_run=mlflow_run,
                     start_info=CheckpointInfo(init_from=START, config=encoder.config))
    remove_owned(pairs)
    return {"adapted": True, **counts, **stats}
