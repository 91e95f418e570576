"""Stage `finetune@task`: one LightningModule for every task kind, from each init of
`finetune.init` (the pretrained encoder, random weights, an imported checkpoint) and each seed.

Examples are encoded once (the tokenizer of the encoder), batched by length so that short
sentences are not padded to the longest of the split, and kept in memory (tasks are small).
Validation runs a few times per epoch; early stopping and the best checkpoint follow the task's
primary metric (accuracy, or entity F1 for token and span tasks). Each run writes its test
predictions; `evaluate@task` scores them. The first init's first seed is exported as the
task's model (safetensors + config + tokenizer + label map).

Shapes: B batch, T subword positions, C labels, W words, S enumerated spans.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

from components.checkpoint import read_weights
from components.config import FinetuneConfig, TaskConfig
from components.errors import ConfigError, DataError
from components.io import atomic_dir, write_json
from components.model import IGNORE, BertConfig, BertForPretraining, build_model, load_hf_state_dict
from components.pretrain import mix, resolve_precision
from components.progress import bar
from components.tokenizer import TOKENIZER_FILES

log = logging.getLogger(__name__)
NULL = "NULL"  # span label of a span that is no entity


# ----------------------------------------------------------------------------- encoding

@dataclass
class Encoded:
    """One example as model input: subword ids, segments, and what the task's loss needs."""

    ids: list[int]
    types: list[int]
    label: int = IGNORE  # classification and pair
    token_labels: list[int] = field(default_factory=list)  # token: per subword (IGNORE where none)
    word_first: list[int] = field(default_factory=list)  # token/span: first subword of each word, -1 if cut
    word_last: list[int] = field(default_factory=list)  # span: last subword of each word
    spans: list[tuple[int, int]] = field(default_factory=list)  # span: enumerated (first, last word)
    span_labels: list[int] = field(default_factory=list)  # span: 0 = NULL, 1.. = label


def label_space(kind: str, labels: list[str]) -> list[str]:
    """What the head predicts: the labels, BIO tags of the entity types, or NULL + types."""
    if kind == "token":
        return ["O"] + [f"{p}-{t}" for t in labels for p in ("B", "I")]
    if kind == "span":
        return [NULL, *labels]
    return list(labels)


def fit_length(ids: list[int], max_len: int, long_text: str) -> list[int]:
    """[CLS] body [SEP] cut to max_len: keep the head, or the head (1/4) and the tail (3/4), which
    for long documents keeps the conclusion (Sun et al., 2019)."""
    if len(ids) <= max_len:
        return ids
    body, keep = ids[1:-1], max_len - 2
    if long_text == "head_tail":
        head = keep // 4
        body = body[:head] + body[len(body) - (keep - head):]
    else:
        body = body[:keep]
    return [ids[0], *body, ids[-1]]


def enumerate_spans(n_words: int, max_words: int) -> list[tuple[int, int]]:
    """Every (first, last) word span of at most max_words words: sum over w of (n - w + 1)."""
    return [(i, j) for i in range(n_words) for j in range(i, min(n_words, i + max_words))]


def align_words(word_ids: list[int | None], n_words: int) -> tuple[list[int], list[int]]:
    """First and last subword position of each word (-1 for words cut by truncation)."""
    first, last = [-1] * n_words, [-1] * n_words
    for pos, w in enumerate(word_ids):
        if w is None:
            continue
        if first[w] < 0:
            first[w] = pos
        last[w] = pos
    return first, last


def encode(table: pa.Table, kind: str, tokenizer, labels: list[str], max_len: int,
           long_text: str = "truncate", label_subwords: str = "all",
           max_span_words: int = 8) -> list[Encoded]:
    """Encode a split of task data (components.tasks columns) for the task's head."""
    space = {name: i for i, name in enumerate(label_space(kind, labels))}
    tok = tokenizer  # configured (truncation) per kind below
    if kind == "classification":
        tok.no_truncation()  # cut by fit_length, which can keep the tail too
        encs = tok.encode_batch(table["text"].to_pylist())
        return [Encoded(fit_length(e.ids, max_len, long_text), [0] * min(len(e.ids), max_len),
                        space[lab]) for e, lab in zip(encs, table["label"].to_pylist(), strict=True)]
    tok.enable_truncation(max_len, strategy="longest_first")
    if kind == "pair":
        pairs = list(zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(), strict=True))
        encs = tok.encode_batch(pairs)
        return [Encoded(e.ids, e.type_ids, space[lab])
                for e, lab in zip(encs, table["label"].to_pylist(), strict=True)]
    words, tags = table["tokens"].to_pylist(), table["tags"].to_pylist()
    encs = [_every_word_a_piece(tok, e, ws) for e, ws in
            zip(tok.encode_batch(words, is_pretokenized=True), words, strict=True)]
    out = []
    for e, ws, ts in zip(encs, words, tags, strict=True):
        first, last = align_words(e.word_ids, len(ws))
        ex = Encoded(e.ids, e.type_ids, word_first=first, word_last=last)
        if kind == "token":
            ex.token_labels = token_labels(e.word_ids, [space[t] for t in ts], label_subwords)
        else:
            from components.evaluate import bio_to_spans

            gold = {(s, end - 1): space[t] for s, end, t in bio_to_spans(ts)}
            kept = sum(1 for f in first if f >= 0)  # words that survived truncation
            ex.spans = enumerate_spans(kept, max_span_words)
            ex.span_labels = [gold.get(s, 0) for s in ex.spans]
        out.append(ex)
    return out


def _every_word_a_piece(tok, enc, words: list[str]):
    """The encoding with every word before the truncation point owning at least one subword:
    a word the normaliser erases (a zero-width space, a soft hyphen) becomes [UNK], so word i's
    subwords never stand in for word i + 1's."""
    seen = {w for w in enc.word_ids if w is not None}
    last = max(seen, default=-1)
    if len(seen) == last + 1:
        return enc
    from components.tokenizer import UNK

    return tok.encode([w if i in seen or i > last else UNK for i, w in enumerate(words)],
                      is_pretokenized=True)


def token_labels(word_ids: list[int | None], word_tags: list[int], label_subwords: str) -> list[int]:
    """Per-subword training labels: every subword carries its word's tag (`all`, as in the BERT
    literature) or only the first one does (`first`); specials carry none."""
    labels, previous = [], None
    for w in word_ids:
        if w is None or (label_subwords == "first" and w == previous):
            labels.append(IGNORE)
        else:
            labels.append(word_tags[w])
        previous = w
    return labels


# ----------------------------------------------------------------------------- batching

def collate(examples: list[Encoded], kind: str) -> dict[str, torch.Tensor]:
    """Pad a list of examples to their longest; add what the kind's loss and decoding need."""
    B, T = len(examples), max(len(e.ids) for e in examples)
    ids = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        types[i, :len(e.types)] = torch.tensor(e.types)
        mask[i, :len(e.ids)] = True
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if kind in ("classification", "pair"):
        batch["labels"] = torch.tensor([e.label for e in examples])
    if kind == "token":
        labels = torch.full((B, T), IGNORE, dtype=torch.long)
        for i, e in enumerate(examples):
            labels[i, :len(e.token_labels)] = torch.tensor(e.token_labels)
        batch["labels"] = labels
    if kind in ("token", "span"):
        W = max(1, max(len(e.word_first) for e in examples))
        first = torch.full((B, W), -1, dtype=torch.long)
        for i, e in enumerate(examples):
            first[i, :len(e.word_first)] = torch.tensor(e.word_first, dtype=torch.long)
        batch["word_first"] = first  # (B, W)
    if kind == "span":
        S = max(1, max(len(e.spans) for e in examples))
        start = torch.zeros(B, S, dtype=torch.long)
        end = torch.zeros(B, S, dtype=torch.long)
        width = torch.zeros(B, S, dtype=torch.long)
        labels = torch.full((B, S), IGNORE, dtype=torch.long)
        for i, e in enumerate(examples):
            if not e.spans:
                continue
            sp = torch.tensor(e.spans)  # (S_i, 2) first and last word
            start[i, :len(sp)] = torch.tensor([e.word_first[a] for a, _ in e.spans])
            end[i, :len(sp)] = torch.tensor([e.word_last[b] for _, b in e.spans])
            width[i, :len(sp)] = sp[:, 1] - sp[:, 0]
            labels[i, :len(sp)] = torch.tensor(e.span_labels)
        batch.update(span_start=start, span_end=end, span_width=width, span_labels=labels)
    return batch


def length_batches(lengths: list[int], batch_size: int, rng: np.random.Generator | None) -> list[list[int]]:
    """Batches of similar length (little padding): sort within chunks of 50 batches, then
    shuffle the batches. No rng: one sorted pass (evaluation)."""
    order = np.arange(len(lengths)) if rng is None else rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return [[int(i) for i in b] for b in batches]


class Batches(IterableDataset):
    """Length-bucketed batches, reshuffled every epoch from (seed, epoch)."""

    def __init__(self, examples: list[Encoded], kind: str, batch_size: int, seed: int | None):
        self.examples, self.kind, self.batch_size, self.seed = examples, kind, batch_size, seed
        self.lengths = [len(e.ids) for e in examples]
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def order(self) -> list[list[int]]:
        rng = None if self.seed is None else np.random.default_rng(mix(self.seed, self.epoch))
        return length_batches(self.lengths, self.batch_size, rng)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = self.order()
        self.epoch += 1
        for b in order:
            yield {**collate([self.examples[i] for i in b], self.kind), "index": torch.tensor(b)}


# ----------------------------------------------------------------------------- decoding

def word_emissions(emissions: torch.Tensor, word_first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first subword's emissions of each word: (B, W, C), and the mask of kept words (B, W)
    (words cut by truncation and padding have word_first -1, and come last in each row)."""
    rows = torch.arange(emissions.shape[0])[:, None]
    return emissions[rows, word_first.clamp(min=0)], word_first >= 0


def word_tags(emissions: torch.Tensor, word_first: torch.Tensor, n_words: list[int],
              space: list[str], crf=None) -> list[list[str]]:
    """Word-level BIO: the first subword's argmax (or the CRF's Viterbi path) per word; words
    cut by truncation get O."""
    per_word, kept = word_emissions(emissions, word_first)  # (B, W, C), (B, W)
    if crf is not None:
        paths = crf.viterbi(per_word, kept)
    else:
        paths = [row[m].tolist() for row, m in zip(per_word.argmax(-1), kept, strict=True)]
    return [[space[t] for t in path] + ["O"] * (n - len(path))
            for path, n in zip(paths, n_words, strict=True)]


ScoredSpan = tuple[int, int, str, float]  # first word, end word (exclusive), label, score


def pick_spans(candidates: list[ScoredSpan], decoding: str) -> list[ScoredSpan]:
    """`nested`: every candidate; `greedy`: by descending score, those overlapping no kept span.
    Spans are (first word, end word exclusive, label, score)."""
    if decoding == "nested":
        return sorted(candidates)
    kept: list[ScoredSpan] = []
    for c in sorted(candidates, key=lambda c: -c[3]):
        if all(c[1] <= k[0] or k[1] <= c[0] for k in kept):
            kept.append(c)
    return sorted(kept)


@torch.no_grad()
def predict(model, kind: str, examples: list[Encoded], space: list[str], batch_size: int,
            span_decoding: str = "nested", threshold: float | None = None) -> list:
    """Predictions in example order: (label, score) for classification and pairs, word-level
    BIO tags for token tasks, [(first word, end word exclusive, label, score)] for spans.

    Span candidates are the spans whose argmax is not NULL or, with a threshold, whose best
    label's probability reaches it."""
    model.eval()
    device = next(model.parameters()).device  # validation runs outside Lightning's batch transfer
    out: list = [None] * len(examples)
    for batch in Batches(examples, kind, batch_size, seed=None):
        index = batch["index"].tolist()
        batch = {k: v.to(device) for k, v in batch.items()}
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        if kind in ("classification", "pair"):
            probs = torch.softmax(model(**inputs), dim=-1)  # (B, C)
            score, label = probs.max(-1)
            rows = [(space[int(c)], float(s)) for c, s in zip(label, score, strict=True)]
        elif kind == "token":
            n_words = [len(examples[i].word_first) for i in index]
            rows = word_tags(model(**inputs), batch["word_first"], n_words, space, model.crf)
        else:
            probs = torch.softmax(model(**inputs, **{k: batch[k] for k in SPAN_INPUTS}), dim=-1)
            best_p, best_c = probs[..., 1:].max(-1)  # (B, S): best non-NULL label, its probability
            keep = (probs.argmax(-1) != 0) if threshold is None else best_p >= threshold
            keep &= batch["span_labels"] != IGNORE
            rows = []
            for b, i in enumerate(index):
                spans = examples[i].spans
                rows.append(pick_spans([(spans[s][0], spans[s][1] + 1, space[int(best_c[b, s]) + 1],
                                         float(best_p[b, s])) for s in keep[b].nonzero()[:, 0].tolist()],
                                       span_decoding))
        for i, row in zip(index, rows, strict=True):
            out[i] = row
    return out


SPAN_INPUTS = ("span_start", "span_end", "span_width")


# ----------------------------------------------------------------------------- training

def loss_of(model, kind: str, batch: dict) -> torch.Tensor:
    """The task's training loss on one batch."""
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    if kind in ("classification", "pair"):
        return F.cross_entropy(model(**inputs), batch["labels"])  # (B, C) vs (B,)
    if kind == "token":
        emissions = model(**inputs)  # (B, T, C)
        if model.crf is None:
            return F.cross_entropy(emissions.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        # The CRF scores word-level paths: first subwords' emissions and the words' tags.
        per_word, kept = word_emissions(emissions, batch["word_first"])
        rows = torch.arange(len(kept))[:, None]
        tags = batch["labels"][rows, batch["word_first"].clamp(min=0)].clamp(min=0)  # (B, W)
        return model.crf.nll(per_word, tags, kept)
    logits = model(**inputs, **{k: batch[k] for k in SPAN_INPUTS})  # (B, S, 1 + labels)
    return F.cross_entropy(logits.flatten(0, 1), batch["span_labels"].flatten(), ignore_index=IGNORE)


def score(kind: str, space: list[str], predictions: list, gold: pa.Table) -> float:
    """The task's primary metric, computed as evaluate@task computes it on the test split (for
    text tasks `space` is the label set)."""
    from components.evaluate import primary_metric, score_run

    return score_run(kind, space, gold, predictions_table(kind, predictions))[primary_metric(kind)]


def task_model(bert: BertConfig, kind: str, space: list[str], crf: bool = False,
               max_span_words: int = 8):
    """The head for a task kind over `space` (label_space), randomly initialised."""
    head = "classification" if kind == "pair" else kind  # a pair is one [CLS] A [SEP] B [SEP] text
    # The span head adds NULL itself: `space` is NULL + labels.
    return build_model(bert, head, num_labels=len(space) - (kind == "span"), crf=crf,
                       max_span_words=max_span_words)


def pretrained_config(encoder_dir: Path) -> BertConfig:
    """The exported encoder's shape (with the fine-tuning dropout it was exported with)."""
    info = json.loads((Path(encoder_dir) / "bertflow.json").read_text())
    return BertConfig(**info["config"])


def model_tokenizer(model_dir: Path, cfg: BertConfig):
    """The tokenizer saved with a model, checked against the model: a tokenizer from another
    training would index the wrong embeddings (or past the end of them) without a word."""
    from components.tokenizer import PAD, load

    tokenizer = load(model_dir)
    size, pad = tokenizer.get_vocab_size(), tokenizer.token_to_id(PAD)
    if size != cfg.vocab_size or pad != cfg.pad_id:
        raise DataError(f"{model_dir}: the tokenizer does not match the model: {size} tokens "
                        f"({PAD} = {pad}) against a vocabulary of {cfg.vocab_size} "
                        f"({PAD} = {cfg.pad_id}); the two were not trained together")
    return tokenizer


def pretraining_model(encoder_dir: Path, cfg: BertConfig) -> BertForPretraining:
    """The exported encoder with its pretraining heads (MLM, NSP), weights loaded; heads an
    imported checkpoint lacks stay as initialised (they are not used for fine-tuning)."""
    state = read_weights(Path(encoder_dir) / "model.safetensors")
    pretrained = BertForPretraining(cfg)
    if (Path(encoder_dir) / "config.json").exists():  # post-norm: transformers' names
        load_hf_state_dict(pretrained, state)
    else:
        state["mlm.decoder.weight"] = state["encoder.embeddings.word.weight"]
        pretrained.load_state_dict(state)
    return pretrained


def load_encoder_weights(model, encoder_dir: Path, cfg: BertConfig) -> None:
    """Copy the pretrained encoder (and pooler, for classification) into a task model.

    The throwaway pretraining model is built on a forked random stream: its initialisation
    would otherwise advance the seed's stream, and a pretrained run and a run from scratch of
    the same seed would draw different dropout masks and batch orders.
    """
    with torch.random.fork_rng(devices=[]):
        pretrained = pretraining_model(encoder_dir, cfg)
    model.encoder.load_state_dict(pretrained.encoder.state_dict())
    if hasattr(model, "pooler"):
        model.pooler.load_state_dict(pretrained.pooler.state_dict())


def freeze_all_but_last(model, k: int) -> None:
    """Train only the last k encoder blocks and the head (k = -1: everything trains)."""
    if k < 0:
        return
    encoder = model.encoder
    for p in encoder.embeddings.parameters():
        p.requires_grad = False
    for block in encoder.blocks[: max(0, len(encoder.blocks) - k)]:
        for p in block.parameters():
            p.requires_grad = False


@dataclass(frozen=True)
class RunSpec:
    """One fine-tuning run of a task: which init, which seed, and the task's settings."""

    kind: str
    space: list[str]
    init: str  # "pretrained", "scratch" or "checkpoint"
    seed: int
    epochs: int
    max_span_words: int
    span_decoding: str


def _module(spec: RunSpec, bert: BertConfig, cfg: FinetuneConfig, weights: Path | None,
            valid: list[Encoded], valid_gold: pa.Table, steps: int):
    import lightning as L

    class FinetuneModule(L.LightningModule):
        """One module for all task kinds: the head comes from build_model, the loss from loss_of."""

        def __init__(self) -> None:
            super().__init__()
            self.model = task_model(bert, spec.kind, spec.space, cfg.crf, spec.max_span_words)
            if weights is not None:
                load_encoder_weights(self.model, weights, bert)
                # Only pretrained layers are worth keeping: from scratch always trains them all.
                freeze_all_but_last(self.model, cfg.train_last_k)
            self.history: list[dict] = []
            self._losses: list[float] = []

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            loss = loss_of(self.model, spec.kind, batch)
            self._losses.append(float(loss.detach()))
            self.log("train/loss", loss, batch_size=len(batch["index"]))
            return loss

        def validation_step(self, batch: dict, batch_idx: int) -> None:
            pass  # scored as a whole in on_validation_epoch_end (entity F1 is not a batch mean)

        def on_validation_epoch_end(self) -> None:
            metric = score(spec.kind, spec.space, predict(self.model, spec.kind, valid, spec.space,
                                                          cfg.batch_size * 2, spec.span_decoding), valid_gold)
            self.model.train()
            self.log("val/metric", metric)
            loss = float(np.mean(self._losses)) if self._losses else float("nan")
            self._losses = []
            self.history.append({"step": self.global_step, "epoch": self.global_step / max(steps, 1),
                                 "val_metric": metric, "train_loss": loss})

        def configure_optimizers(self):
            from components.pretrain import lr_lambda

            params = [p for p in self.model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(
                [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                 {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=cfg.lr)
            total = steps * spec.epochs
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(max(1, total // 10), total))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return FinetuneModule()


def train_run(spec: RunSpec, bert: BertConfig, cfg: FinetuneConfig, weights: Path | None,
              train: list[Encoded], valid: list[Encoded], valid_gold: pa.Table, work: Path):
    """Fit one run with early stopping, from the encoder in `weights` (None: random weights);
    return the model at its best validation pass and the validation history."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    L.seed_everything(spec.seed, workers=True, verbose=False)
    data = Batches(train, spec.kind, cfg.batch_size, spec.seed)
    steps = len(data)
    module = _module(spec, bert, cfg, weights, valid, valid_gold, steps)
    # Validation a few times per epoch (not on a partial last interval): early stopping and
    # the best checkpoint see the model as it improves, not only at epoch ends.
    interval = max(1, steps // cfg.evals_per_epoch)
    best = ModelCheckpoint(dirpath=work, monitor="val/metric", mode="max", save_top_k=1,
                           save_weights_only=True, filename="best")
    trainer = L.Trainer(
        accelerator="auto", devices=1, precision=resolve_precision("auto"), max_epochs=spec.epochs,
        val_check_interval=interval, num_sanity_val_steps=0, limit_val_batches=1,
        gradient_clip_val=1.0, logger=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=cfg.deterministic,
        callbacks=[best, EarlyStopping("val/metric", mode="max", patience=cfg.patience)],
    )
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=None),
                val_dataloaders=DataLoader(Batches(valid[:1], spec.kind, 1, None), batch_size=None))
    state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    return module.model.cpu().eval(), module.history, trainer.global_step


@dataclass
class TaskRuns:
    """Everything the runs of one task share: shipped once to each worker process."""

    name: str
    task: TaskConfig
    cfg: FinetuneConfig
    bert: BertConfig
    labels: list[str]
    encoder_dir: Path
    weights: dict[str, Path | None]  # init -> the encoder folder it starts from
    out: Path  # the stage's temporary output folder
    encoded: dict[str, list[Encoded]]
    valid_gold: pa.Table
    max_len: int  # tokens per example, as resolved for this task


def finetune_task(name: str, task: TaskConfig, cfg: FinetuneConfig, task_dir: Path,
                  encoder_dir: Path, out_dir: Path, checkpoint_dir: Path | None = None) -> dict:
    """Every run of one task (each init of `cfg.init`, each seed): test predictions and
    validation curves per run, and the exported first run of the first init."""
    from components.tasks import read_meta, read_split

    if not (Path(encoder_dir) / "bertflow.json").exists():
        raise DataError(f"{encoder_dir}: no pretrained encoder; run the pretrain stage first")
    meta = read_meta(task_dir)
    if meta["kind"] != task.kind:
        raise DataError(f"{task_dir}: holds {meta['kind']} data, but task {name} is {task.kind}")
    bert = pretrained_config(encoder_dir)
    tokenizer = model_tokenizer(encoder_dir, bert)
    read_weights(Path(encoder_dir) / "model.safetensors")  # fail now, not in every run's process
    weights = {"pretrained": Path(encoder_dir), "scratch": None, "checkpoint": checkpoint_dir}
    if "checkpoint" in cfg.init:
        _check_same_shape(checkpoint_dir, bert, encoder_dir)
    max_len = min(task.max_seq_len or cfg.max_seq_len, bert.max_position)
    splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
    encoded = {s: encode(t, task.kind, tokenizer, meta["labels"], max_len, task.long_text,
                         cfg.label_subwords, task.max_span_words) for s, t in splits.items()}
    runs = [(init, seed) for init in cfg.init for seed in cfg.seeds]
    stats: dict = {"kind": task.kind, "labels": len(meta["labels"]), "max_seq_len": max_len,
                   "train_examples": len(encoded["train"]), "runs": {}}
    with atomic_dir(out_dir) as tmp:
        (tmp / "runs").mkdir()
        shared = TaskRuns(name, task, cfg, bert, meta["labels"], Path(encoder_dir), weights, tmp, encoded,
                          splits["valid"], max_len)
        workers = run_workers(cfg.workers, len(runs))
        if workers == 1:
            summaries = [train_and_predict(shared, init, seed)
                         for init, seed in bar(runs, f"finetune {name}", len(runs), "run")]
        else:
            summaries = _in_processes(shared, runs, workers)
        for summary in summaries:
            run = f"{summary['init']}-s{summary['seed']}"
            stats["runs"][run] = {k: summary[k] for k in ("steps", "best_val_metric", "minutes")}
        stats["workers"] = workers
        shutil.rmtree(tmp / "work", ignore_errors=True)
    return stats


def _check_same_shape(checkpoint_dir: Path | None, bert: BertConfig, encoder_dir: Path) -> None:
    """The `checkpoint` arm shares the encoder's tokenizer and shape: it must be its start."""
    from components.checkpoint import read_info

    info = read_info(checkpoint_dir) if checkpoint_dir is not None else {"init_from": ""}
    if not info["init_from"]:
        raise ConfigError("finetune.init has checkpoint, but no checkpoint was imported "
                          "(pretrain.init_from is empty)")
    ours = {k: getattr(bert, k) for k in ("vocab_size", "hidden", "layers", "heads", "intermediate")}
    theirs = {k: info["config"][k] for k in ours}
    if ours != theirs:
        raise DataError(f"finetune.init checkpoint: {checkpoint_dir} ({theirs}) is not the shape "
                        f"of the encoder {encoder_dir} ({ours}); rerun the pretrain stage")


def run_workers(workers: int, runs: int) -> int:
    """Runs trained at once: `finetune.workers`, or with 0 one per CPU core on CPU (a small
    model's step is too short to keep two cores busy: on 2 cores two runs of one thread each
    did ~1.25x the work of one run of two threads) and one on a GPU."""
    import os

    if workers == 0:
        workers = 1 if torch.cuda.is_available() else (os.cpu_count() or 1)
    return max(1, min(workers, runs))


def _in_processes(shared: TaskRuns, runs: list[tuple[str, int]], workers: int) -> list[dict]:
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    # Spawned, not forked: the parent's torch and tokenizers thread pools don't survive fork.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(shared, threads)) as pool:
        return list(bar(pool.map(_worker_run, runs), f"finetune {shared.name}", len(runs), "run"))


_SHARED: TaskRuns | None = None  # a worker process's copy of the task's data


def _worker_init(shared: TaskRuns, threads: int) -> None:
    global _SHARED
    from pipeline import env

    env.configure()  # the same quiet logging as the parent
    torch.set_num_threads(threads)
    _SHARED = shared


def _worker_run(run: tuple[str, int]) -> dict:
    assert _SHARED is not None
    return train_and_predict(_SHARED, *run)


def train_and_predict(shared: TaskRuns, init: str, seed: int) -> dict:
    """One run: train, predict the test split, write `runs/<init>-s<seed>.{parquet,json}`; the
    first init's first seed is also exported as the task's model."""
    task, cfg, encoded = shared.task, shared.cfg, shared.encoded
    space = label_space(task.kind, shared.labels)
    run = f"{init}-s{seed}"
    spec = RunSpec(task.kind, space, init, seed, task.epochs or cfg.epochs, task.max_span_words,
                   task.span_decoding)
    start = time.perf_counter()
    model, history, steps = train_run(spec, shared.bert, cfg, shared.weights[init], encoded["train"],
                                      encoded["valid"], shared.valid_gold, shared.out / "work" / run)
    threshold = None
    if task.kind == "span" and cfg.span_threshold:
        threshold = calibrate_threshold(model, spec, encoded["valid"], shared.valid_gold, cfg.batch_size * 2)
    test = predict(model, task.kind, encoded["test"], space, cfg.batch_size * 2, task.span_decoding,
                   threshold)
    pq.write_table(predictions_table(task.kind, test), shared.out / "runs" / f"{run}.parquet")
    best = max((h["val_metric"] for h in history), default=float("nan"))
    summary = {"init": init, "seed": seed, "steps": steps, "best_val_metric": best,
               "threshold": threshold, "minutes": (time.perf_counter() - start) / 60, "history": history}
    write_json(shared.out / "runs" / f"{run}.json", summary)
    log.info("finetune %s %s: best validation %.4f in %d steps, %.1f min", shared.name, run, best,
             steps, summary["minutes"])
    if init == cfg.init[0] and seed == cfg.seeds[0]:
        export(model, shared, run, space, threshold)
    return summary


def calibrate_threshold(model, spec: RunSpec, valid: list[Encoded], gold: pa.Table, batch_size: int) -> float:
    """The span score threshold with the best validation F1 (a grid over (0, 1))."""
    grid = [round(t, 2) for t in np.arange(0.1, 0.95, 0.05)]
    scores = {t: score(spec.kind, spec.space, predict(model, spec.kind, valid, spec.space, batch_size,
                                          spec.span_decoding, t), gold) for t in grid}
    return max(scores, key=scores.get)


def predictions_table(kind: str, predictions: list) -> pa.Table:
    """Predictions of one run, one row per example in split order (what evaluate@task reads)."""
    if kind in ("classification", "pair"):
        table = pa.table({"pred": [p[0] for p in predictions], "score": [p[1] for p in predictions]})
    elif kind == "token":
        table = pa.table({"pred_tags": predictions})
    else:
        spans = [[{"start": a, "end": b, "label": lab, "score": s} for a, b, lab, s in row]
                 for row in predictions]
        table = pa.table({"pred_spans": pa.array(spans, type=pa.list_(pa.struct(
            [("start", pa.int32()), ("end", pa.int32()), ("label", pa.string()), ("score", pa.float32())])))})
    return table


def export(model, shared: TaskRuns, run: str, space: list[str], threshold: float | None) -> None:
    """The task's model: safetensors weights, the tokenizer files, and bertflow.json with what
    encoding and decoding need (config, label map, max length, subword labelling, threshold)."""
    from safetensors.torch import save_file

    out = shared.out / "model"
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    for f in TOKENIZER_FILES:
        if (shared.encoder_dir / f).exists():
            shutil.copy(shared.encoder_dir / f, out / f)
    write_json(out / "bertflow.json", {
        "config": asdict(shared.bert), "task": asdict(shared.task), "run": run,
        "labels": shared.labels, "id2label": dict(enumerate(space)), "max_seq_len": shared.max_len,
        "label_subwords": shared.cfg.label_subwords, "crf": getattr(model, "crf", None) is not None,
        "threshold": threshold})
