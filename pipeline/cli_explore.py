"""`bertflow fill-mask | embed | similarity | attention`: look inside the pretrained encoder.

The encoder is the registry's newest `encoder` version, or the folder given with --model (the
pretrain stage writes one to data/models/encoder). Light at import, like the CLI.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from components.core.errors import BertflowError, ConfigError
from pipeline.cli_common import ParamsOption, check_output, registry_client

ModelOption = Annotated[Path | None, typer.Option(
    "--model", help="An exported encoder folder.", show_default="the registry's newest encoder",
    file_okay=False)]


@contextlib.contextmanager
def encoder(model: Path | None, params: Path) -> Iterator:
    """The encoder to look into: `model`, or the newest registered version (downloaded to a
    temp folder for the command's duration)."""
    from components.lifecycle.explore import load_encoder

    if model is not None:
        yield load_encoder(model)
        return
    import mlflow

    from components.lifecycle.registry import CANDIDATE, ENCODER, resolve

    try:
        client = registry_client(params)
        version = resolve(client, f"{ENCODER}@{CANDIDATE}")  # the newest encoder version
    except BertflowError as e:
        raise BertflowError(f"{e}; or give --model FOLDER (the pretrain stage writes "
                            "data/models/encoder)") from None
    with tempfile.TemporaryDirectory(prefix="bertflow-encoder-") as tmp:
        local = mlflow.artifacts.download_artifacts(f"models:/{ENCODER}/{version.version}", dst_path=tmp)
        yield load_encoder(Path(local))


def fill_mask(
    text: Annotated[str, typer.Argument(help='Text with one or more [MASK], e.g. "The [MASK] rose."')],
    top_k: Annotated[int, typer.Option(help="Predictions per [MASK].", min=1)] = 5,
    model: ModelOption = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """The encoder's top predictions, with probabilities, for each [MASK] in TEXT."""
    from components.lifecycle.explore import fill_mask as predict

    with encoder(model, params) as enc:
        answers = predict(enc, text, top_k)
    for i, answer in enumerate(answers, 1):
        prefix = f"[MASK] {i}: " if len(answers) > 1 else ""
        typer.echo(prefix + "  ".join(f"{token} {p:.3f}" for token, p in answer))


def embed(
    text: Annotated[list[str] | None, typer.Option(help="Text to embed (repeatable).")] = None,
    file: Annotated[Path | None, typer.Option(help="CSV or JSONL with a `text` column, streamed.",
                                              exists=True, dir_okay=False)] = None,
    out: Annotated[Path, typer.Option(help="Output: .parquet (text + vector) or .npy (N x H).")] = \
        Path("embeddings.parquet"),
    pooling: Annotated[str, typer.Option(help="Sentence vector: mean of the tokens, or [CLS].")] = "mean",
    tokens: Annotated[bool, typer.Option(help="Token vectors instead (Parquet only): one row "
                                               "per text with its tokens and their vectors.")] = False,
    model: ModelOption = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Contextual vectors of texts: one per sentence (pooled) or one per token."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.core.io import atomic_file
    from components.core.progress import bar
    from components.lifecycle.explore import embed as pooled
    from components.lifecycle.explore import token_vectors
    from components.lifecycle.rows import read_batches

    if (file is None) == (not text):
        raise ConfigError("give --text (one or more) or --file")
    if blank := [str(i) for i, t in enumerate(text or [], 1) if not t.strip()]:
        raise ConfigError(f"--text {', '.join(blank)} of {len(text)}: empty or whitespace-only text")
    if pooling not in ("mean", "cls"):
        raise ConfigError(f"--pooling must be mean or cls, not {pooling!r}")
    if out.suffix not in (".parquet", ".npy") or (tokens and out.suffix == ".npy"):
        raise ConfigError(f"{out}: write .parquet (or .npy for sentence vectors)")
    check_output(out, "--out", params)
    batches = iter([[{"text": t} for t in text]]) if file is None else read_batches(file, 256)
    with encoder(model, params) as enc, atomic_file(out) as tmp:
        texts, vectors, writer = [], [], None
        for rows in bar(batches, "embed", unit="batch"):
            if any("text" not in row for row in rows):
                raise ConfigError(f"{file}: every row needs a `text` field")
            if any(not str(row["text"] or "").strip() for row in rows):
                raise ConfigError(f"{file}: a row's `text` is empty or whitespace only")
            chunk = [row["text"] for row in rows]
            if out.suffix == ".npy":
                vectors.append(pooled(enc, chunk, pooling))  # type: ignore[arg-type]
                texts += chunk
                continue
            if tokens:
                pieces = [token_vectors(enc, t) for t in chunk]
                table = pa.table({"text": chunk, "tokens": [p[0] for p in pieces],
                                  "vectors": [p[1].tolist() for p in pieces]})
            else:
                table = pa.table({"text": chunk, "vector": pooled(enc, chunk, pooling).tolist()})  # type: ignore[arg-type]
            writer = writer or pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()
        else:
            np.save(tmp, np.concatenate(vectors) if vectors else np.zeros((0, enc.cfg.hidden)))
        count = len(texts) if out.suffix == ".npy" else pq.ParquetFile(tmp).metadata.num_rows
    typer.echo(f"{out}: {count} texts, {'token' if tokens else pooling + '-pooled'} vectors of "
               f"size {enc.cfg.hidden}", err=True)


def similarity(
    word: Annotated[str, typer.Argument(help="The word to follow across contexts.")],
    context: Annotated[list[str], typer.Option(help="A text holding WORD (two or more).")],
    model: ModelOption = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """How WORD's contextual vector changes with its context: a cosine table (the "bank" test)."""
    import numpy as np

    from components.lifecycle.explore import cosine_table, word_in_context

    if len(context) < 2:
        raise ConfigError("give two or more --context")
    with encoder(model, params) as enc:
        table = cosine_table(np.stack([word_in_context(enc, word, c) for c in context]))
    for i, c in enumerate(context, 1):
        typer.echo(f"[{i}] {c}")
    typer.echo("     " + "".join(f"{f'[{j}]':>7s}" for j in range(1, len(context) + 1)))
    for i, row in enumerate(table, 1):
        typer.echo(f"{f'[{i}]':5s}" + "".join(f"{v:7.3f}" for v in row))


def attention(
    text: Annotated[str, typer.Argument(help="The text to look at.")],
    layer: Annotated[int, typer.Option(help="Layer, 1 to L (0: the last).")] = 0,
    head: Annotated[int, typer.Option(help="Head, 1 to the number of heads.", min=1)] = 1,
    out: Annotated[Path, typer.Option(help="The PNG to write.")] = Path("attention.png"),
    model: ModelOption = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """A heatmap of one layer's and head's attention over TEXT's tokens."""
    from components.lifecycle.explore import attention_maps, plot_attention

    check_output(out, "--out", params)
    with encoder(model, params) as enc:
        tokens, maps = attention_maps(enc, text)  # (layers, heads, T, T)
    layers, heads = maps.shape[:2]
    layer = layer or layers
    if not (1 <= layer <= layers and head <= heads):
        raise ConfigError(f"the encoder has {layers} layers of {heads} heads: --layer 1..{layers}, "
                          f"--head 1..{heads}")
    plot_attention(tokens, maps[layer - 1, head - 1], f"layer {layer}, head {head}: {text}", out)
    typer.echo(f"{out}: layer {layer} of {layers}, head {head} of {heads}, {len(tokens)} tokens")


COMMANDS = {"fill-mask": fill_mask, "embed": embed, "similarity": similarity, "attention": attention}
