"""Great Expectations suites for each stage's data contract (docs/architecture.md, "Data contracts").

Each check runs on one shard and, for the big list columns, on per-row statistics computed with
numpy (a bounded frame, never the corpus). A failure raises ValidationError naming the shard
and every failed expectation with a few offending values; the caller, which writes into a temp
folder, then drops that folder, so nothing half-made is left.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import ValidationError

if TYPE_CHECKING:
    import pandas as pd

Expectation = tuple[str, dict[str, Any]]
"""A GX expectation class name (great_expectations.expectations.<name>) and its arguments."""


@functools.cache
def _batch_definition() -> Any:
    import great_expectations as gx  # ~5 s to import: only when data is validated
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("frames").add_dataframe_asset(name="frame")
    return asset.add_batch_definition_whole_dataframe("whole")


def validate(frame: pd.DataFrame, suite: str, expectations: Sequence[Expectation],
             where: str | Path) -> None:
    """Run the expectations on `frame`; raise ValidationError listing every failure."""
    import great_expectations as gx

    gx_suite = gx.ExpectationSuite(
        name=suite,
        expectations=[getattr(gx.expectations, name)(**kw) for name, kw in expectations],
    )
    batch = _batch_definition().get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(gx_suite)
    if result.success:
        return
    failed = []
    for r in result.results:
        if r.success:
            continue
        kwargs = {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}
        seen = r.result.get("partial_unexpected_list") or r.result.get("observed_value")
        count = r.result.get("unexpected_count")
        failed.append(f"{r.expectation_config.type}({_short(kwargs)})"
                      + (f": {count} rows fail" if count else "")
                      + (f", e.g. {_short(seen)}" if seen not in (None, []) else ""))
    raise ValidationError(f"{where}: suite '{suite}' failed: " + "; ".join(failed))


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value[:5] if isinstance(value, list) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_raw_shard(table: pa.Table, sources: Sequence[str], where: Path) -> None:
    """Ingest output: `doc_id` unique and present, `source` a configured one, `text` non-empty."""
    import pandas as pd

    frame = pd.DataFrame({
        "doc_id": table["doc_id"].to_pandas(),
        "source": table["source"].to_pandas(),
        "chars": pc.utf8_length(table["text"]).to_numpy(zero_copy_only=False),
    })
    validate(frame, "raw_documents", [
        ("ExpectColumnValuesToNotBeNull", {"column": "doc_id"}),
        ("ExpectColumnValuesToBeUnique", {"column": "doc_id"}),
        ("ExpectColumnValuesToBeInSet", {"column": "source", "value_set": list(sources)}),
        ("ExpectColumnValuesToBeBetween", {"column": "chars", "min_value": 1}),
    ], where)


def check_clean_shard(table: pa.Table, min_sentences: int, min_chars: int, max_chars: int,
                      where: Path) -> None:
    """Clean output: one row per document with at least `min_sentences` non-empty sentences."""
    import pandas as pd

    sentences = table["sentences"].combine_chunks()
    lengths = pc.utf8_length(sentences.flatten()).to_numpy(zero_copy_only=False)
    counts = pc.list_value_length(sentences).to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    has_rows = counts > 0
    shortest = np.zeros(len(counts), dtype=np.int64)
    longest = np.zeros(len(counts), dtype=np.int64)
    if lengths.size:  # reduceat needs segment starts inside the array: only non-empty rows
        shortest[has_rows] = np.minimum.reduceat(lengths, starts[has_rows])
        longest[has_rows] = np.maximum.reduceat(lengths, starts[has_rows])
    frame = pd.DataFrame({
        "doc_id": table["doc_id"].to_pandas(),
        "sentences": counts,
        "shortest": shortest,
        "longest": longest,
    })
    validate(frame, "clean_documents", [
        ("ExpectColumnValuesToNotBeNull", {"column": "doc_id"}),
        ("ExpectColumnValuesToBeUnique", {"column": "doc_id"}),
        ("ExpectColumnValuesToBeBetween", {"column": "sentences", "min_value": min_sentences}),
        ("ExpectColumnValuesToBeBetween", {"column": "shortest", "min_value": min_chars}),
        ("ExpectColumnValuesToBeBetween", {"column": "longest", "max_value": max_chars}),
    ], where)


def pairs_row_stats(table: pa.Table, sep_id: int) -> pd.DataFrame:
    """Per-instance statistics of a pairs shard, vectorised over the flat token arrays."""
    import pandas as pd

    ids_col = table["input_ids"].combine_chunks()
    types_col = table["token_type_ids"].combine_chunks()
    ids = ids_col.flatten().to_numpy()
    types = types_col.flatten().to_numpy()
    lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    row = np.repeat(np.arange(n), lengths)  # (N_tokens,) instance of each token
    pos = np.arange(ids.size) - starts[row]  # (N_tokens,) position inside its instance
    is_sep = ids == sep_id
    # Segment ids must be 0 up to and including the first [SEP], then 1 (BERT's layout).
    first_sep = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first_sep, row[is_sep], pos[is_sep])
    seg_ok = (types == (pos > first_sep[row])).astype(np.int64)
    nonempty = lengths > 0
    stats = {name: np.zeros(n, dtype=np.int64) for name in
             ("first", "last", "max_id", "min_id", "seps", "segments_ok", "max_type")}
    if ids.size:
        s = starts[nonempty]
        stats["first"][nonempty] = ids[s]
        stats["last"][nonempty] = ids[s + lengths[nonempty] - 1]
        stats["max_id"][nonempty] = np.maximum.reduceat(ids, s)
        stats["min_id"][nonempty] = np.minimum.reduceat(ids, s)
        stats["seps"][nonempty] = np.add.reduceat(is_sep.astype(np.int64), s)
        stats["segments_ok"][nonempty] = np.minimum.reduceat(seg_ok, s)
        stats["max_type"][nonempty] = np.maximum.reduceat(types.astype(np.int64), s)
    stats["length"] = lengths
    stats["types_length"] = pc.list_value_length(types_col).to_numpy(zero_copy_only=False)
    stats["label"] = table["next_sentence_label"].to_numpy()
    return pd.DataFrame(stats)


def check_pairs_shard(table: pa.Table, *, cls_id: int, sep_id: int, vocab_size: int,
                      max_seq_len: int, nsp: bool, where: Path) -> None:
    """Pairs output: [CLS] first, [SEP] last, ids in range; NSP: two [SEP], segments 0 then 1."""
    frame = pairs_row_stats(table, sep_id)
    frame["types_match"] = frame["types_length"] == frame["length"]
    expectations: list[Expectation] = [
        ("ExpectColumnValuesToBeInSet", {"column": "first", "value_set": [cls_id]}),
        ("ExpectColumnValuesToBeInSet", {"column": "last", "value_set": [sep_id]}),
        ("ExpectColumnValuesToBeBetween", {"column": "min_id", "min_value": 0}),
        ("ExpectColumnValuesToBeBetween", {"column": "max_id", "max_value": vocab_size - 1}),
        ("ExpectColumnValuesToBeBetween",
         {"column": "length", "min_value": 3, "max_value": max_seq_len}),
        ("ExpectColumnValuesToBeInSet", {"column": "types_match", "value_set": [True]}),
    ]
    if nsp:
        expectations += [
            ("ExpectColumnValuesToBeInSet", {"column": "seps", "value_set": [2]}),
            ("ExpectColumnValuesToBeInSet", {"column": "segments_ok", "value_set": [1]}),
            ("ExpectColumnValuesToBeInSet", {"column": "label", "value_set": [0, 1]}),
        ]
    else:
        expectations += [
            ("ExpectColumnValuesToBeInSet", {"column": "label", "value_set": [-1]}),
            ("ExpectColumnValuesToBeInSet", {"column": "max_type", "value_set": [0]}),
        ]
    validate(frame, "pairs", expectations, where)
