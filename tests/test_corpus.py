"""Stages ingest and clean on real text and on bad input."""

from __future__ import annotations

import codecs
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.config import CleanConfig, ExecutorConfig, IngestConfig
from components.core.errors import DataError, ValidationError
from components.core.io import list_shards
from components.data.clean import CLEAN_SCHEMA, choose_heldout, clean, normalize
from components.data.ingest import RAW_SCHEMA, ingest
from components.data.text import decode_bytes, split_sentences
from tests.conftest import PACKAGES, ROOT, section, source_config

SERIAL = section(ExecutorConfig, kind="serial")
PROSE = ("The committee met on Tuesday to discuss the budget. Members argued about the schools. "
         "The chair asked for a vote before lunch. Nobody expected the result to be so close.")


def _patterns(cfg: CleanConfig):
    return [(re.compile(r.pattern), r.repl) for r in cfg.replacements]


def _read(folder: Path) -> list[dict]:
    return [row for p in list_shards(folder) for row in pq.read_table(p).to_pylist()]


def test_ingest_user_folder_counts_binary_empty_and_non_utf8(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "good.txt").write_text(PROSE, encoding="utf-8")
    (corpus / "sub" / "latin1.txt").write_bytes("Café au lait. Voilà un résumé.".encode("cp1252"))
    (corpus / "empty.txt").write_bytes(b"  \n\n")
    (corpus / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (corpus / "notes.md").write_text("not a .txt file")
    out = tmp_path / "raw"
    stats = ingest(section(IngestConfig, sources=[source_config("mine", kind="txt_dir",
                                                                path=str(corpus))]),
                   tmp_path, PACKAGES, out)
    rows = {r["doc_id"]: r for r in _read(out)}
    assert set(rows) == {"mine:good.txt", "mine:sub/latin1.txt"}
    assert rows["mine:sub/latin1.txt"]["text"] == "Café au lait. Voilà un résumé."
    assert stats["dropped"] == {"binary": 1, "empty": 1}
    assert stats["non_utf8_decoded"] == 1
    assert any("image.txt: binary" in p for p in stats["problems"])


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32", "utf-32-be"])
def test_utf16_and_utf32_with_a_bom_are_text_not_binary(codec):
    # Windows editors save "Unicode" as UTF-16 with a BOM: every other byte is NUL.
    bom = {"utf-16-be": codecs.BOM_UTF16_BE, "utf-32-be": codecs.BOM_UTF32_BE}.get(codec, b"")
    assert decode_bytes(bom + "Naïve café. Second line.".encode(codec), "cp1252") == \
        ("Naïve café. Second line.", "ok")


CAFE = "Caf\u00e9 au lait. Voil\u00e0 un r\u00e9sum\u00e9.\nIt said \u201chello\u201d."
ENCODED = {
    # name: (the file's bytes, its text as ingest must read it, counted in non_utf8_decoded)
    "utf16.txt": (CAFE.encode("utf-16"), CAFE, 0),
    "utf8-bom.txt": (CAFE.encode("utf-8-sig"), CAFE, 0),
    # A UTF-8 file with one stray cp1252 byte (0x85, an ellipsis) in its second line: the rest
    # stays as written (it was all read as cp1252: every é an Ã©).
    "stray.txt": (CAFE.encode() + b" And more\x85", CAFE + " And more\u2026", 1),
    "utf16.jsonl": ((json.dumps({"text": CAFE}) + "\n").encode("utf-16"), CAFE, 0),
    "utf32be.jsonl": (codecs.BOM_UTF32_BE + (json.dumps({"text": CAFE}) + "\n").encode("utf-32-be"), CAFE, 0),
    # Not UTF-8: read as the fallback encoding, as a .txt file is (it failed as "not a valid
    # JSON line"); U+2028 inside a string stays (lines end at \n only).
    "cp1252.jsonl": ((json.dumps({"text": CAFE + "\u2028"}, ensure_ascii=False) + "\n").encode("cp1252",
                                                                                           "replace"),
                     CAFE + "?", 1),
    "stray.jsonl": (json.dumps({"text": CAFE}, ensure_ascii=False).encode()[:-2] + b'\x85"}\n',
                    CAFE + "\u2026", 1),
}


@pytest.mark.parametrize("name", list(ENCODED))
def test_a_corpus_file_in_another_encoding_is_read_as_its_text(tmp_path, name):
    data, text, counted = ENCODED[name]
    (tmp_path / name).write_bytes(data)
    kind = "txt_dir" if name.endswith(".txt") else "jsonl"
    stats = ingest(section(IngestConfig, sources=[source_config("s", kind=kind, path=name)]),
                   tmp_path, PACKAGES, tmp_path / "raw")
    assert [r["text"] for r in _read(tmp_path / "raw")] == [text]
    assert (stats["non_utf8_decoded"], stats["dropped"]) == (counted, {})


CORPUS_ERRORS = {
    # name: (the source file's content, what the one error says besides its name)
    "bad.parquet": (b"PAR1 not Parquet at all", "bad.parquet: not a readable Parquet file"),
    "numbers.parquet": (pa.table({"text": [1, 2]}), "numbers.parquet: row 0: column 'text' is not text"),
    "number.jsonl": (b'{"text": 7}\n', "number.jsonl:1: field 'text' is int, not a string"),
    "list.jsonl": (b'["text"]\n', "list.jsonl:1: no field 'text'"),
    "binary.jsonl": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary.jsonl:1: not a valid JSON line"),
    "cut.jsonl": (codecs.BOM_UTF16_LE + '{"text": "x"}\n'.encode("utf-16-le")[:-1],
                  "cut.jsonl: not readable as utf-16-le though it starts with its byte order mark"),
}


@pytest.mark.parametrize("name", list(CORPUS_ERRORS))
def test_an_unreadable_corpus_file_is_one_error_naming_it(tmp_path, name):
    content, message = CORPUS_ERRORS[name]
    if isinstance(content, pa.Table):
        pq.write_table(content, tmp_path / name)
    else:
        (tmp_path / name).write_bytes(content)
    kind = "jsonl" if name.endswith(".jsonl") else "parquet"
    with pytest.raises(DataError) as info:
        ingest(section(IngestConfig, sources=[source_config("s", kind=kind, path=name)]),
               tmp_path, PACKAGES, tmp_path / "raw")
    assert str(info.value).startswith(f"{tmp_path}/{message}"), info.value
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written, no temp folder


def test_symlinks_in_a_user_folder_are_followed_inside_the_project_and_refused_outside(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    corpus = project / "data" / "user" / "corpus"
    (project / "shared").mkdir(parents=True)
    corpus.mkdir(parents=True)
    elsewhere.mkdir()
    (project / "shared" / "speech.txt").write_text(PROSE)
    (corpus / "speeches").symlink_to(project / "shared")  # a linked folder: was skipped silently
    (corpus / "loop").symlink_to(corpus)  # a cycle: each folder once
    sources = [source_config("mine", kind="txt_dir", path="data/user/corpus")]
    stats = ingest(section(IngestConfig, sources=sources), project, PACKAGES, project / "raw")
    assert {r["doc_id"] for r in _read(project / "raw")} == {"mine:speeches/speech.txt"}
    assert stats["documents"] == 1
    (elsewhere / "secret.txt").write_text(PROSE)
    (corpus / "outside.txt").symlink_to(elsewhere / "secret.txt")  # was read, unversioned
    with pytest.raises(DataError, match=r"outside.txt: leads to .*elsewhere/secret.txt, outside "
                                        r"the project"):
        ingest(section(IngestConfig, sources=sources), project, PACKAGES, project / "raw2")
    (corpus / "outside.txt").unlink()
    (corpus / "gone.txt").symlink_to(project / "nothing.txt")
    with pytest.raises(DataError, match=r"gone.txt: a broken symbolic link"):
        ingest(section(IngestConfig, sources=sources), project, PACKAGES, project / "raw2")


def test_decode_bytes_tells_binary_from_text():
    assert decode_bytes("naïve".encode(), "cp1252") == ("naïve", "ok")
    assert decode_bytes("naïve".encode("cp1252"), "cp1252") == ("naïve", "fallback")
    assert decode_bytes(b"\x00\x01\x02abc", "cp1252")[1] == "binary"
    assert decode_bytes(bytes(range(1, 32)) * 20, "cp1252")[1] == "binary"  # controls, no NUL
    assert decode_bytes(b"\n \t", "cp1252")[1] == "empty"


def test_ingest_jsonl_bad_line_names_file_and_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "docs.jsonl"
    bad.write_text(json.dumps({"text": PROSE}) + "\n" + '{"text": "unterminated\n')
    out = tmp_path / "raw"
    with pytest.raises(DataError, match=r"docs.jsonl:2: not a valid JSON line"):
        ingest(section(IngestConfig, sources=[source_config("j", kind="jsonl", path="docs.jsonl")]),
               tmp_path,
               PACKAGES, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["docs.jsonl"]  # no temp folder left behind


def test_ingest_jsonl_missing_field_and_parquet_missing_column(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": PROSE}) + "\n")
    with pytest.raises(DataError, match=r"a.jsonl:1: no field 'text'"):
        ingest(section(IngestConfig, sources=[source_config("j", kind="jsonl", path="a.jsonl")]),
               tmp_path, PACKAGES,
               tmp_path / "raw")
    pq.write_table(pa.table({"body": [PROSE]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b.parquet: no column 'text'"):
        ingest(section(IngestConfig, sources=[source_config("p", kind="parquet", path="b.parquet")]),
               tmp_path,
               PACKAGES, tmp_path / "raw")


def test_ingest_jsonl_missing_id_field_names_the_line(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "x", "text": PROSE}) + "\n"
                                      + json.dumps({"text": PROSE}) + "\n")
    with pytest.raises(DataError, match=r"a.jsonl:2: no field 'id'"):
        ingest(section(IngestConfig, sources=[source_config("j", kind="jsonl", path="a.jsonl",
                                                            id_field="id")]),
               tmp_path, PACKAGES, tmp_path / "raw")


def test_ingest_jsonl_and_parquet_with_ids(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(
        json.dumps({"id": f"j{i}", "text": PROSE}) + "\n" for i in range(3)))
    pq.write_table(pa.table({"text": [PROSE, None, PROSE]}), tmp_path / "b.parquet")
    stats = ingest(section(IngestConfig, sources=[
        source_config("j", kind="jsonl", path="a.jsonl", id_field="id"),
        source_config("p", kind="parquet", path="b.parquet"),
    ]), tmp_path, PACKAGES, tmp_path / "raw")
    ids = [r["doc_id"] for r in _read(tmp_path / "raw")]
    assert ids == ["j:j0", "j:j1", "j:j2", "p:b.parquet:0", "p:b.parquet:2"]
    assert stats["dropped"] == {"empty": 1}


def test_ingest_of_nothing_is_an_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "e.txt").write_text("")
    with pytest.raises(DataError, match=r"no documents in any source \(mine\); dropped: \{'empty': 1\}"):
        ingest(section(IngestConfig, sources=[source_config("mine", kind="txt_dir", path="c")]),
               tmp_path, PACKAGES,
               tmp_path / "raw")


def test_packaged_corpora_are_read_by_path(stages_dir):
    stats = json.loads(json.dumps(_read(stages_dir / "raw")[:1]))
    assert stats[0]["doc_id"] == "sotu:1790-Washington-1"
    assert stats[0]["text"].startswith("Fellow-Citizens of the Senate")
    sources = {r["source"] for r in _read(stages_dir / "raw")}
    assert sources == {"sotu", "news-articles"}


def test_normalize_repairs_the_real_news_mojibake_and_controls():
    cfg = section(CleanConfig)
    raw = ('The Senate voted on DeVos"?highly contentious nomination. "It is hard,"?Sen. '
           'Warren said.\tIt didn"t\u200b pass\x07 the "?first time. the "Black swans"?appearance '
           'caf\u00c3\u00a9')
    assert normalize(raw, cfg, _patterns(cfg)) == (
        "The Senate voted on DeVos' highly contentious nomination. \"It is hard,\" Sen. "
        "Warren said. It didn't pass the — first time. the \"Black swans' appearance café")


def test_split_sentences_keeps_paragraphs_apart_and_joins_wrapped_lines():
    text = "Mr. Smith went home. He slept.\n\nA new paragraph that was\nwrapped at a column\nends here."
    assert split_sentences(text) == [
        "Mr. Smith went home.", "He slept.", "A new paragraph that was wrapped at a column ends here."]


def test_heldout_choice_is_stable_and_never_empty_on_small_corpora():
    ids = [f"d{i}" for i in range(2000)]
    held = choose_heldout(ids, 0.02, 0)
    assert 20 < len(held) < 60
    assert choose_heldout(list(reversed(ids)), 0.02, 0) == held  # order does not matter
    assert held <= choose_heldout(ids + ["new"], 0.02, 0)  # adding a document moves none
    assert len(choose_heldout(["a", "b", "c"], 0.02, 0)) == 1  # 2% of 3 rounds to one
    assert choose_heldout(["a"], 0.02, 0) == set() and choose_heldout(ids, 0.0, 0) == set()


def _raw_shard(folder: Path, docs: list[tuple[str, str]], name: str = "part-00000.parquet"):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"doc_id": [d for d, _ in docs], "source": ["t"] * len(docs),
                             "text": [t for _, t in docs]}, schema=RAW_SCHEMA), folder / name)


def test_clean_filters_and_dedups_exact_and_near(tmp_path):
    long_doc = " ".join(f"Sentence number {i} talks about topic {i % 7} at some length." for i in range(60))
    near = long_doc.replace("number 30 ", "number thirty ")
    docs = [
        ("a", long_doc),
        ("b", long_doc),                      # exact duplicate of a
        ("c", near),                          # near duplicate of a
        ("d", PROSE),
        ("e", "Just one sentence here."),     # too few sentences
        ("f", "A different story starts here. It has two sentences at least. And a third one."
              "\n\n12345 67890 ==== ++++\n\n\ufffd broken \ufffd text."),
    ]
    _raw_shard(tmp_path / "raw", docs[:3])
    _raw_shard(tmp_path / "raw", docs[3:], "part-00001.parquet")  # dedup works across shards
    cfg = section(CleanConfig, heldout_fraction=0.5, seed=0)
    stats = clean(cfg, SERIAL, tmp_path / "raw", tmp_path / "clean")
    kept = {r["doc_id"]: r["sentences"] for split in ("train", "heldout")
            for r in _read(tmp_path / "clean" / split)}
    assert set(kept) == {"a", "d", "f"}
    assert stats["documents_dropped"] == {"exact_duplicate": 1, "near_duplicate": 1,
                                          "few_sentences": 1}
    assert stats["sentences_dropped"]["low_letters"] == 1
    assert stats["sentences_dropped"]["replacement_char"] == 1
    assert kept["f"][-1] == "And a third one."
    for split in ("train", "heldout"):
        assert {r["doc_id"] for r in _read(tmp_path / "clean" / split)} == \
            {d for d in kept if (d in choose_heldout(sorted(kept), 0.5, 0)) == (split == "heldout")}


def test_clean_parallel_equals_serial(stages_dir, tmp_path):
    # Worker count must not change a byte of the output.
    clean(section(CleanConfig, heldout_fraction=0.1), SERIAL, stages_dir / "raw", tmp_path / "serial")
    for split in ("train", "heldout"):
        a, b = list_shards(stages_dir / "clean" / split), list_shards(tmp_path / "serial" / split)
        assert [p.name for p in a] == [p.name for p in b]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))


def test_clean_output_contract(stages_dir):
    table = pq.read_table(list_shards(stages_dir / "clean" / "train")[0])
    assert table.schema.equals(CLEAN_SCHEMA)
    assert len(list_shards(stages_dir / "clean" / "heldout")) == 1


def test_clean_failed_expectation_names_shard_and_leaves_nothing(tmp_path):
    # Two raw documents with one id: the clean suite's uniqueness expectation must stop the stage.
    _raw_shard(tmp_path / "raw", [("same", PROSE), ("same", PROSE.upper())])
    out = tmp_path / "clean"
    with pytest.raises(ValidationError) as err:
        clean(section(CleanConfig, heldout_fraction=0.0, dedup_exact=False, dedup_near=False), SERIAL,
              tmp_path / "raw", out)
    msg = str(err.value)
    assert "clean/train/part-00000.parquet" in msg
    assert "expect_column_values_to_be_unique" in msg and "'same'" in msg
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_clean_of_an_all_trash_corpus_says_why(tmp_path):
    _raw_shard(tmp_path / "raw", [("x", "Hi."), ("y", "1234 5678.")])
    with pytest.raises(DataError, match=r"no documents left .*few_sentences: 2"):
        clean(section(CleanConfig), SERIAL, tmp_path / "raw", tmp_path / "clean")
    assert not (tmp_path / "clean").exists()


def test_dask_executor_gives_the_same_output(stages_dir, tmp_path):
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        clean(section(CleanConfig, heldout_fraction=0.1),
              section(ExecutorConfig, kind="dask", dask_address=cluster.scheduler_address),
              stages_dir / "raw", tmp_path / "dask")
    for split in ("train", "heldout"):
        a = list_shards(stages_dir / "clean" / split)
        b = list_shards(tmp_path / "dask" / split)
        assert [x.read_bytes() for x in a] == [y.read_bytes() for y in b]


# The clean stage in a fresh process, its peak RSS growth measured around it.
_CLEAN_MEASURED = """
import json, resource, sys
from pathlib import Path
import great_expectations  # noqa: F401  (~150 MB; validation imports it: before the baseline)
from components.core.params import load_params
from components.data.clean import clean
def peak():  # MB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin"
                                                                  else 2**10)
before = peak()
p = load_params("params.yaml")
stats = clean(p.clean.model_copy(update={"heldout_fraction": 0.02}),
              p.executor.model_copy(update={"kind": "serial"}), Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"stats": stats, "growth_mb": peak() - before}))
"""


def test_clean_of_a_huge_single_line_in_bounded_memory(tmp_path):
    # A 5 MB document on one line: 100,000 short sentences (1.1 million words) around a 1.6 MB
    # run without a space (minified data). Its MinHash alone took 1 KB per word (1.3 GB here,
    # 10 GB for 50 MB); blingfire took 25 bytes per character of the whole line, and more.
    sentences = [f"Row {i} is a bit of a set in a pen." for i in range(100_000)]
    blob = "Data:" + "0123456789abcdef" * 100_000  # longer than a piece of text.PIECE_CHARS
    line = " ".join(sentences[:50_000]) + " " + blob + " " + " ".join(sentences[50_000:])
    around = {"before": ["The committee met on Tuesday to discuss the budget.",
                         "Members argued about the schools."],
              "after": ["The chair asked for a vote before lunch.",
                        "Nobody expected the result to be so close."]}
    _raw_shard(tmp_path / "raw", [("before", " ".join(around["before"])), ("dump", line),
                                  ("after", " ".join(around["after"]))])
    proc = subprocess.run([sys.executable, "-c", _CLEAN_MEASURED, str(tmp_path / "raw"),
                           str(tmp_path / "clean")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the run without a sentence end is one sentence, dropped once; it swallowed the next one
    assert result["stats"]["sentences_dropped"] == {"too_long": 1}
    assert result["stats"]["documents_out"] == 3
    kept = {r["doc_id"]: r["sentences"] for split in ("train", "heldout")
            for r in _read(tmp_path / "clean" / split)}
    assert kept["dump"] == sentences[:50_000] + sentences[50_001:]  # as from the whole line
    assert {d: kept[d] for d in around} == around
    # ~110 MB now, 1,330 MB before the fix
    assert result["growth_mb"] < 500, result["growth_mb"]
