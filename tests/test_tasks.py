"""Stage task_data: the user's own task files, bad input, and the built-in tasks on real data."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.config import FinetuneConfig, TaskConfig
from components.core.errors import ConfigError, DataError, ValidationError
from components.core.guard import OWNED
from components.data.tasks import builtin, checks
from components.data.tasks.folder import SCHEMAS, read_meta, read_split
from components.data.tasks.prepare import prepare_task
from tests.conftest import PACKAGES, section, task_config

SPLITS = ("train", "valid", "test")


def write_csv(path: Path, rows: list[dict]) -> Path:
    """A CSV file with a header from the first row's keys."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """A JSON Lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def reviews(n: int = 100) -> list[dict]:
    """`n` distinct short reviews, labels cycling good/bad/meh."""
    return [{"review": f"review number {i} was {['fine', 'poor', 'odd'][i % 3]}",
             "stars": ["good", "bad", "meh"][i % 3]} for i in range(n)]


CONLL_TRAIN = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP I-LOC
1996-08-22 CD I-NP O
"""
CONLL_DEV = "Rome NNP B-NP B-LOC\nis VBZ B-VP O\n"
CONLL_TEST = "John NNP B-NP B-PER\nsaid VBD B-VP O\n\nParis NNP B-NP B-LOC\n"


def prepare(tmp_path: Path, task: TaskConfig, name: str = "t") -> tuple[dict, Path]:
    """Run prepare_task with `tmp_path` as root; return the stats and the output folder."""
    out = tmp_path / "out" / name
    return prepare_task(name, task, tmp_path, PACKAGES, out), out


# ----------------------------------------------------------------------------- user files

def test_a_task_file_not_in_utf8_is_decoded_counted_and_named(tmp_path, caplog):
    rows = [{"review": f"caf\u00e9 number {i} was {['fine', 'poor'][i % 2]}", "stars": ["good", "bad"][i % 2]}
            for i in range(60)]
    text = "review,stars\n" + "".join(f"{r['review']},{r['stars']}\n" for r in rows)
    (tmp_path / "reviews.csv").write_bytes(text.encode("cp1252"))  # as Excel saves it on Windows
    task = task_config("classification", "reviews.csv", columns={"text": "review", "label": "stars"})
    stats, out = prepare(tmp_path, task)
    assert stats["changed"] == {"non_utf8_decoded_files": 1}
    assert f"{tmp_path / 'reviews.csv'} is not UTF-8; decoded as cp1252" in caplog.text
    import pyarrow.parquet as pq

    assert pq.read_table(out / "train.parquet").column("text")[0].as_py().startswith("caf\u00e9 number")


def test_csv_classification_end_to_end(tmp_path):
    write_csv(tmp_path / "reviews.csv", reviews(100))
    task = task_config("classification", "reviews.csv", columns={"text": "review", "label": "stars"})
    stats, out = prepare(tmp_path, task)
    assert sorted(p.name for p in out.iterdir()) == [
        OWNED, "meta.json", "test.parquet", "train.parquet", "valid.parquet"]
    assert stats["examples"] == {"train": 80, "valid": 10, "test": 10}
    assert read_meta(out) == {"task": "t", "kind": "classification", "labels": ["bad", "good", "meh"]}
    train = read_split(out, "train")
    assert train.schema == pa.schema([("text", pa.string()), ("label", pa.string())])
    assert sum(stats["label_counts"]["train"].values()) == 80
    assert json.loads(json.dumps(stats)) == stats  # the stage's metrics file
    texts = {s: set(read_split(out, s)["text"].to_pylist()) for s in SPLITS}
    assert not (texts["train"] & texts["test"]) and not (texts["valid"] & texts["test"])
    assert set().union(*texts.values()) == {r["review"] for r in reviews(100)}
    # The same seed gives the same split; another seed another one.
    _, again = prepare(tmp_path, task, "again")
    assert read_split(again, "test").equals(read_split(out, "test"))
    task.split_seed += 1
    _, other = prepare(tmp_path, task, "other")
    assert set(read_split(other, "test")["text"].to_pylist()) != texts["test"]
    with pytest.raises(ValueError, match="split must be one of"):
        read_split(out, "dev")


def test_conll_folder_token_task(tmp_path):
    folder = tmp_path / "ner"
    folder.mkdir()
    (folder / "train.txt").write_text(CONLL_TRAIN)
    (folder / "dev.conll").write_text(CONLL_DEV)  # `dev` is accepted for valid
    (folder / "test.iob").write_text(CONLL_TEST)
    stats, out = prepare(tmp_path, task_config("token", "ner"))
    assert stats["examples"] == {"train": 3, "valid": 1, "test": 2}
    assert stats["split"] == "given"
    assert read_meta(out)["labels"] == ["LOC", "MISC", "ORG", "PER"]  # entity types, not tags
    train = read_split(out, "train")
    assert train.schema == pa.schema([("tokens", pa.list_(pa.string())),
                                      ("tags", pa.list_(pa.string()))])
    assert train.to_pylist()[0] == {"tokens": ["EU", "rejects", "German", "call"],
                                    "tags": ["B-ORG", "O", "B-MISC", "O"]}
    # An entity opened with I- (IOB1) is written as BIO2 and counted.
    assert train.to_pylist()[2]["tags"] == ["B-LOC", "O"]
    assert stats["changed"] == {"tags_iob1_to_bio2": 1}
    assert stats["label_counts"]["test"] == {"LOC": 1, "PER": 1}


def test_conll_columns_choose_token_and_tag(tmp_path):
    folder = tmp_path / "pos"
    folder.mkdir()
    for split, text in (("train", CONLL_TRAIN), ("valid", CONLL_DEV), ("test", CONLL_TEST)):
        (folder / f"{split}.txt").write_text(text)
    # The chunk column (2) as the tags: a real BIO task of its own.
    stats, out = prepare(tmp_path, task_config("span", "pos", columns={"tags": "2"}))
    assert read_meta(out)["labels"] == ["NP", "VP"]
    assert read_split(out, "valid").to_pylist() == [{"tokens": ["Rome", "is"],
                                                     "tags": ["B-NP", "B-VP"]}]


POS = {"train": "The DET\ncat NOUN\nsat VERB\n\nA DET\ndog NOUN\nran VERB\nhome NOUN\n",
       "valid": "The DET\ndog NOUN\n", "test": "A DET\ncat NOUN\nsat VERB\n"}


def _pos_folder(tmp_path: Path, files: dict[str, str] = POS) -> str:
    folder = tmp_path / "pos"
    folder.mkdir()
    for split, text in files.items():
        (folder / f"{split}.txt").write_text(text)
    return "pos"


def test_a_tag_set_without_bio_is_plain_tags_and_bio_tags_stay_bio(tmp_path):
    stats, out = prepare(tmp_path, task_config("token", _pos_folder(tmp_path)))
    meta = read_meta(out)
    assert meta["scheme"] == stats["scheme"] == "plain"
    assert meta["labels"] == ["NOUN", "DET", "VERB"]  # the tags, the most frequent first
    assert stats["label_counts"]["train"] == {"DET": 2, "NOUN": 3, "VERB": 2}  # words per tag
    assert read_split(out, "test").to_pylist() == [{"tokens": ["A", "cat", "sat"],
                                                    "tags": ["DET", "NOUN", "VERB"]}]
    # Chunk tags (B-NP, I-NP) fit BIO: entities, as before; and scheme: plain takes them as tags.
    (tmp_path / "chunks").mkdir()
    for split, text in (("train", CONLL_TRAIN), ("valid", CONLL_DEV), ("test", CONLL_TEST)):
        (tmp_path / "chunks" / f"{split}.txt").write_text(text)
    stats, out = prepare(tmp_path, task_config("token", "chunks", columns={"tags": "2"}))
    assert (stats["scheme"], read_meta(out)["labels"]) == ("bio", ["NP", "VP"])
    stats, out = prepare(tmp_path, task_config("token", "chunks", columns={"tags": "2"}, scheme="plain"))
    assert (stats["scheme"], read_meta(out)["labels"]) == ("plain", ["B-NP", "I-NP", "B-VP"])
    assert "changed" not in stats or "tags_iob1_to_bio2" not in stats["changed"]  # plain: as given


def test_plain_tags_mistakes_are_named(tmp_path):
    source = _pos_folder(tmp_path)
    with pytest.raises(DataError) as info:  # a plain file read as BIO: the first bad tag
        prepare(tmp_path, task_config("token", source, scheme="bio"))
    assert "pos/train.txt:1: malformed BIO tag 'DET' on token 'The'" in str(info.value)
    assert "scheme: plain" in str(info.value)
    with pytest.raises(ConfigError, match="span task reads entities from BIO tags"):
        prepare(tmp_path, task_config("span", source, scheme="plain"))
    adj = {"tokens": ["a", "big", "dog"], "tags": ["DET", "ADJ", "NOUN"]}
    write_jsonl(tmp_path / "adj.jsonl", [adj] * 20)
    with pytest.raises(DataError, match="tag 'ADJ' on token 'big' is not one of the task's labels"):
        prepare(tmp_path, task_config("token", "adj.jsonl", labels=["DET", "NOUN"]))
    write_jsonl(tmp_path / "empty.jsonl", [{"tokens": ["a", "dog"], "tags": ["DET", " "]}] * 20)
    with pytest.raises(DataError, match=r"empty.jsonl:\d+, token 2: empty tag on token 'dog'"):
        prepare(tmp_path, task_config("token", "empty.jsonl"))
    write_jsonl(tmp_path / "one.jsonl", [{"tokens": ["a", "dog"], "tags": ["X", "X"]}] * 20)
    with pytest.raises(DataError, match=r"train has only one tag \['X'\]"):
        prepare(tmp_path, task_config("token", "one.jsonl"))


def test_jsonl_pair_task(tmp_path):
    rows = [{"a": f"first sentence {i}", "b": f"second sentence {i}", "label": i % 2}
            for i in range(40)]
    write_jsonl(tmp_path / "pairs.jsonl", rows)
    task = task_config("pair", "pairs.jsonl", columns={"text_a": "a", "text_b": "b"},
                       split=[0.5, 0.25, 0.25], split_seed=3)
    stats, out = prepare(tmp_path, task)
    assert stats["examples"] == {"train": 20, "valid": 10, "test": 10}
    assert read_meta(out)["labels"] == ["0", "1"]  # numeric labels become strings
    test = read_split(out, "test")
    assert test.column_names == ["text_a", "text_b", "label"]
    for row in test.to_pylist():
        i = int(row["text_a"].split()[-1])
        assert row == {"text_a": f"first sentence {i}", "text_b": f"second sentence {i}",
                       "label": str(i % 2)}


def test_folder_with_train_only_is_split_and_parquet_works(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    rows = [{"text": r["review"], "label": r["stars"]} for r in reviews(50)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    stats, out = prepare(tmp_path, task_config("classification", "mine"))
    assert stats["examples"] == {"train": 40, "valid": 5, "test": 5}
    assert "carved from train" in stats["split"]


def test_max_train_examples_samples_train_only(tmp_path):
    write_csv(tmp_path / "r.csv", [{"text": r["review"], "label": r["stars"]} for r in reviews(200)])
    task = task_config("classification", "r.csv", max_train_examples=30)
    stats, out = prepare(tmp_path, task)
    assert stats["examples"] == {"train": 30, "valid": 20, "test": 20}
    assert stats["train_sampled_from"] == 160
    full_stats, full = prepare(tmp_path, task_config("classification", "r.csv"), "full")
    sample = set(read_split(out, "train")["text"].to_pylist())
    assert sample < set(read_split(full, "train")["text"].to_pylist())
    assert read_split(out, "test").equals(read_split(full, "test"))  # the sample leaves test alone
    _, again = prepare(tmp_path, task, "again")
    assert set(read_split(again, "train")["text"].to_pylist()) == sample


# ----------------------------------------------------------------------------- bad input

def _bad_label(tmp_path: Path) -> TaskConfig:
    rows = [{"text": r["review"], "label": r["stars"]} for r in reviews(20)]
    rows[6]["label"] = "awful"
    write_csv(tmp_path / "bad.csv", rows)
    return task_config("classification", "bad.csv", labels=["good", "bad", "meh"])


def _missing_column(tmp_path: Path) -> TaskConfig:
    write_csv(tmp_path / "bad.csv", reviews(20))
    return task_config("classification", "bad.csv", columns={"label": "stars"})


def _conll_missing_tag(tmp_path: Path) -> TaskConfig:
    (tmp_path / "bad.conll").write_text(CONLL_TRAIN.replace("call NN I-NP O", "call"))
    return task_config("token", "bad.conll")


def _jsonl_lengths(tmp_path: Path) -> TaskConfig:
    rows = [{"tokens": ["Rome", "is"], "tags": ["B-LOC", "O"]}] * 5
    rows = rows + [{"tokens": ["Paris", "is", "big"], "tags": ["B-LOC", "O"]}]
    write_jsonl(tmp_path / "bad.jsonl", rows)
    return task_config("token", "bad.jsonl")


def _malformed_tag(tmp_path: Path) -> TaskConfig:
    (tmp_path / "bad.txt").write_text(CONLL_TRAIN.replace("B-MISC", "MISC"))
    return task_config("token", "bad.txt")


def _empty_text(tmp_path: Path) -> TaskConfig:
    rows = [{"text_a": f"a {i}", "text_b": f"b {i}", "label": "x" if i % 2 else "y"}
            for i in range(20)]
    rows[3]["text_b"] = "   "
    write_jsonl(tmp_path / "bad.jsonl", rows)
    return task_config("pair", "bad.jsonl")


def _one_class(tmp_path: Path) -> TaskConfig:
    write_csv(tmp_path / "bad.csv", [{"text": f"text {i}", "label": "spam"} for i in range(20)])
    return task_config("classification", "bad.csv")


def _empty_split(tmp_path: Path) -> TaskConfig:
    folder = tmp_path / "bad"
    folder.mkdir()
    write_csv(folder / "train.csv", [{"text": f"t {i}", "label": "ab"[i % 2]} for i in range(10)])
    write_csv(folder / "valid.csv", [{"text": "v", "label": "a"}])
    (folder / "test.csv").write_text("text,label\n")
    return task_config("classification", "bad")


def _too_small(tmp_path: Path) -> TaskConfig:
    write_csv(tmp_path / "tiny.csv", [{"text": f"t {i}", "label": "ab"[i % 2]} for i in range(4)])
    return task_config("classification", "tiny.csv")


def _binary_csv(tmp_path: Path) -> TaskConfig:
    (tmp_path / "bad.csv").write_bytes(b"\x00\x01PK\x03\x04" * 100)
    return task_config("classification", "bad.csv")


def _broken_parquet(tmp_path: Path) -> TaskConfig:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    return task_config("classification", "bad.parquet")


def _unknown_builtin(tmp_path: Path) -> TaskConfig:
    return task_config("classification", "imdb-sentiment")


def _duplicate_header(tmp_path: Path) -> TaskConfig:
    # `review,verdict,review`: every text was read from the last column, without a word.
    (tmp_path / "bad.csv").write_text("review,verdict,review\n" + "".join(
        f"great film {i},{'pos' if i % 2 else 'neg'},note {i}\n" for i in range(30)))
    return task_config("classification", "bad.csv", columns={"text": "review", "label": "verdict"})


def _label_with_a_stray_space(tmp_path: Path) -> TaskConfig:
    rows = [{"text": f"review {i}", "label": "pos" if i % 2 else "neg"} for i in range(40)]
    rows[9]["label"] = " neg"  # was a third class
    write_csv(tmp_path / "bad.csv", rows)
    return task_config("classification", "bad.csv")


def _spans_all_too_long(tmp_path: Path) -> TaskConfig:
    name = "The United States Department of Health and Human Services".split()
    rows = [{"tokens": [*name, "said", str(i)], "tags": ["B-ORG"] + ["I-ORG"] * 8 + ["O", "O"]}
            for i in range(20)]
    write_jsonl(tmp_path / "bad.jsonl", rows)
    return task_config("span", "bad.jsonl", max_span_words=8)


def _file(name: str, content: bytes | str | pa.Table, kind: str = "classification",
          **task) -> Callable[[Path], TaskConfig]:
    """A task reading the one file `name`, holding `content` (a table: as Parquet)."""
    def make(tmp_path: Path) -> TaskConfig:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, pa.Table):
            pq.write_table(content, path)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        return task_config(kind, name.partition("/")[0], **task)
    return make


def _folder(files: dict[str, str], kind: str = "classification", **task) -> Callable[[Path], TaskConfig]:
    """A task reading the folder `bad` of `files` (name -> text)."""
    def make(tmp_path: Path) -> TaskConfig:
        for name, text in files.items():
            _file(f"bad/{name}", text)(tmp_path)
        return task_config(kind, "bad", **task)
    return make


ROWS = "text,label\n" + "".join(f"review {i},{'ab'[i % 2]}\n" for i in range(30))
ROW_COUNT = 31  # ROWS' lines, header included
JSON_ROWS = [{"text": f"review {i}", "label": "ab"[i % 2]} for i in range(30)]
CONLL_ROWS = "".join(f"Word{i} NN B-NP {'B-PER' if i % 3 else 'O'}\n\n" for i in range(30))
ERROR_CASES = {
    # case: (make the task, text the message must contain: file, row/line, value)
    "unknown_label": (_bad_label, ["bad.csv:8 (row 7)", "'awful'", "['bad', 'good', 'meh']"]),
    "missing_column": (_missing_column, ["bad.csv:1 (header)", "no column 'text'",
                                         "['review', 'stars']"]),
    "conll_missing_tag": (_conll_missing_tag, ["bad.conll:6", "different lengths", "'call'"]),
    "token_tag_lengths": (_jsonl_lengths, ["bad.jsonl:6", "3 tokens but 2 tags"]),
    # One tag not BIO among BIO tags: a typo, not a plain tag set.
    "malformed_tag": (_malformed_tag, ["bad.txt:5", "'MISC'", "'German'", "is not BIO", "scheme: plain"]),
    "empty_text": (_empty_text, ["bad.jsonl:4", "empty text_b"]),
    "one_class": (_one_class, ["bad.csv", "only one class", "'spam'"]),
    "empty_split": (_empty_split, ["bad/test.csv", "test split is empty"]),
    "too_small_to_split": (_too_small, ["tiny.csv", "valid split is empty", "4 examples"]),
    "unreadable_csv": (_binary_csv, ["bad.csv", "not a readable text file"]),
    "unreadable_parquet": (_broken_parquet, ["bad.parquet", "not a readable Parquet file"]),
    "unknown_builtin": (_unknown_builtin, ["'imdb-sentiment'", "movie-sentiment", "news-order"]),
    "duplicate_header": (_duplicate_header, ["bad.csv:1 (header)", "column 'review' appears more "
                                             "than once"]),
    "label_stray_space": (_label_with_a_stray_space, ["bad.csv:", "label ' neg' differs from 'neg' "
                                                      "only by spaces or case (1 vs "]),
    "spans_all_too_long": (_spans_all_too_long, ["every entity in train is longer than "
                                                 "max_span_words (8)", "max_span_words"]),
    # Empty, binary and broken files of each format.
    "csv_empty_file": (_file("bad.csv", b""), ["bad.csv: empty, not even a header line", "text, label"]),
    "csv_row_short": (_file("bad.csv", ROWS + "a review without its label\n"),
                      [f"bad.csv:{ROW_COUNT + 1} (row {ROW_COUNT})", "1 of the header's 2 fields"]),
    "csv_row_long": (_file("bad.csv", ROWS + "fine, really,a\n"),
                     [f"bad.csv:{ROW_COUNT + 1} (row {ROW_COUNT})", "3 fields but the header has 2"]),
    # The lenient reader took the rest of the file as one text, or dropped the quotes.
    "csv_quote_left_open": (_file("bad.csv", ROWS + '"an open quote,a\n' + ROWS[11:]),
                            [f"bad.csv:{ROW_COUNT + 1}: not readable as CSV (unexpected end of data)"]),
    "csv_text_after_quote": (_file("bad.csv", ROWS + '"quoted" then,a\n'),
                             [f"bad.csv:{ROW_COUNT + 1}: not readable as CSV", "written twice"]),
    "jsonl_not_json": (_file("bad.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", \n'),
                       ["bad.jsonl:2: not a valid JSON line"]),
    "binary_conll": (_file("bad.conll", b"\x89PNG\r\n\x1a\n\x00\x00" * 50, "token"),
                     ["bad.conll", "not a readable text file"]),
    "empty_conll": (_file("bad.conll", b"", "token"), ["bad.conll", "train split is empty: 0 examples"]),
    # Missing columns, per format (extra ones are ignored: test_extra_columns_are_ignored).
    "jsonl_missing_column": (_file("bad.jsonl", "".join(json.dumps({"text": r["text"]}) + "\n"
                                                        for r in JSON_ROWS)),
                             ["bad.jsonl:1", "no column 'label'", "columns present: ['text']"]),
    "parquet_missing_column": (_file("bad.parquet", pa.Table.from_pylist(JSON_ROWS).drop(["label"])),
                               ["bad.parquet", "no column 'label'", "columns present: ['text']"]),
    "parquet_text_not_text": (_file("bad.parquet", pa.table({"text": range(30), "label": ["a", "b"] * 15})),
                              ["bad.parquet: row 0", "'text' must be text, got int 0"]),
    "jsonl_tags_missing": (_file("bad.jsonl", json.dumps({"tokens": ["Rome"], "tag": ["B-LOC"]}) + "\n",
                                 "token"), ["bad.jsonl:1", "no column 'tags'"]),
    # Labels of valid or test that train never has.
    "label_unseen_in_valid": (_folder({"train.csv": ROWS, "valid.csv": "text,label\nv,c\n",
                                       "test.csv": "text,label\nw,a\n"}),
                              ["bad/valid.csv:2 (row 1)", "label 'c' in valid never occurs in train",
                               "['a', 'b']"]),
    "entity_unseen_in_valid": (_folder({"train.txt": CONLL_TRAIN, "valid.txt": "Rome NNP B-NP B-CITY\n",
                                        "test.txt": CONLL_TEST}, "token"),
                               ["bad/valid.txt:1", "entity type 'CITY' in valid never occurs in train",
                                "['LOC', 'MISC', 'ORG', 'PER']"]),
    "tag_unseen_in_test": (_folder({"train.txt": POS["train"], "valid.txt": POS["valid"],
                                    "test.txt": "A DET\nbig ADJ\ncat NOUN\n"}, "token"),
                           ["bad/test.txt:1", "tag 'ADJ' in test never occurs in train"]),
    # Broken CoNLL lines: a column too many, a blank-line structure gone.
    "conll_extra_column": (_file("bad.conll", CONLL_ROWS + "Paris NNP B-NP B-LOC extra\n", "token"),
                           ["bad.conll:61", "5 column(s)", "earlier lines have 4"]),
    "conll_no_blank_lines": (_folder({"train.txt": CONLL_ROWS.replace("\n\n", "\n") * 40,
                                      "valid.txt": CONLL_DEV, "test.txt": CONLL_TEST}, "token"),
                             ["bad/train.txt:1: 1200 tokens from line 1 on without a blank line"]),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_input_names_file_and_row_and_writes_nothing(tmp_path, case):
    make, expected = ERROR_CASES[case]
    task = make(tmp_path)
    out = tmp_path / "out" / "t"
    with pytest.raises(DataError) as info:
        prepare_task("t", task, tmp_path, PACKAGES, out)
    for text in expected:
        assert text in str(info.value), f"{text!r} not in {info.value}"
    assert not out.exists()
    assert not list(tmp_path.glob("out/.t.*"))  # no temp folder left behind either


def test_json_lines_may_hold_line_separators_inside_strings(tmp_path):
    # U+2028 and U+0085 are valid inside a JSON string; str.splitlines split lines at them.
    rows = [{"text": f"line one\u2028line two\u0085 {i}", "label": "ab"[i % 2]} for i in range(30)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    stats, out = prepare(tmp_path, task_config("classification", "r.jsonl"))
    assert sum(stats["examples"].values()) == 30
    assert "\u2028" in read_split(out, "train")["text"][0].as_py()


def _splits(out: Path) -> dict[str, list[dict]]:
    """Every split of a prepared task, as rows."""
    return {split: read_split(out, split).to_pylist() for split in SPLITS}


CAFE_ROWS = "text,label\n" + "".join(f"caf\u00e9 review {i} was \u201cfine\u201d,{'ab'[i % 2]}\n"
                                     for i in range(30))
CAFE_CONLL = "".join(f"Caf\u00e9 B-ORG\nopened O\nin O\nP\u00e9cs{i} B-LOC\n\n" for i in range(30))


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
@pytest.mark.parametrize(("name", "text", "kind"), [("r.csv", CAFE_ROWS, "classification"),
                                                   ("r.conll", CAFE_CONLL, "token")], ids=["csv", "conll"])
def test_utf16_and_utf32_task_files_with_a_bom_read_as_their_utf8_copy(tmp_path, codec, name, text, kind):
    # Windows' "Unicode" (UTF-16 with a BOM) and UTF-8 with a BOM, as Excel and Notepad save them.
    bom = {"utf-16-be": "\ufeff"}.get(codec, "")
    (tmp_path / name).write_bytes((bom + text).encode(codec))
    (tmp_path / "utf8").mkdir()
    (tmp_path / "utf8" / name).write_text(text, encoding="utf-8")
    stats, out = prepare(tmp_path, task_config(kind, name))
    _, utf8 = prepare(tmp_path, task_config(kind, f"utf8/{name}"), "utf8")
    assert _splits(out) == _splits(utf8)
    assert stats["changed"] == {}  # decoded as what it is: nothing to count


def test_stray_bytes_in_a_utf8_task_file_leave_the_rest_as_written(tmp_path, caplog):
    # One row pasted from a cp1252 file (its curly quotes are bytes 0x93, 0x94): the file is
    # not UTF-8, but only those bytes are read as cp1252; every é elsewhere stays é (not Ã©).
    data = CAFE_ROWS.encode() + b"a \x93pasted\x94 review,b\n"
    (tmp_path / "r.csv").write_bytes(data)
    stats, out = prepare(tmp_path, task_config("classification", "r.csv"))
    texts = {row["text"] for rows in _splits(out).values() for row in rows}
    assert texts == {f"caf\u00e9 review {i} was \u201cfine\u201d" for i in range(30)} | \
        {"a \u201cpasted\u201d review"}
    assert stats["changed"] == {"non_utf8_decoded_files": 1}
    assert f"{tmp_path / 'r.csv'} is not UTF-8" in caplog.text


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_extra_columns_are_ignored(tmp_path, fmt):
    rows = [{"id": i, **r, "note": f"n{i}"} for i, r in enumerate(JSON_ROWS)]
    write = {"csv": write_csv, "jsonl": write_jsonl,
             "parquet": lambda path, rows: pq.write_table(pa.Table.from_pylist(rows), path)}[fmt]
    (tmp_path / "plain").mkdir()
    write(tmp_path / f"r.{fmt}", rows)
    write(tmp_path / "plain" / f"r.{fmt}", JSON_ROWS)
    _, out = prepare(tmp_path, task_config("classification", f"r.{fmt}"))
    _, plain = prepare(tmp_path, task_config("classification", f"plain/r.{fmt}"), "plain")
    assert _splits(out) == _splits(plain)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_text_of_a_whole_article_on_one_line_is_read(tmp_path, fmt):
    # 320,000 characters in one field: over the csv module's default limit (131,072).
    article = "A long article. " * 20_000
    if fmt == "csv":
        (tmp_path / "r.csv").write_text(ROWS + f'"{article}",a\n')
    else:
        write_jsonl(tmp_path / "r.jsonl", [*JSON_ROWS, {"text": article, "label": "a"}])
    stats, out = prepare(tmp_path, task_config("classification", f"r.{fmt}"))
    assert sum(stats["examples"].values()) == 31
    assert article in {row["text"] for rows in _splits(out).values() for row in rows}


CLEAN_CONLL = "".join(f"Ann{i} B-PER\nLee I-PER\nwent O\nhome O\n\n" for i in range(30))


@pytest.mark.parametrize("variant", {
    "crlf": CLEAN_CONLL.replace("\n", "\r\n"),
    "blank_lines_of_spaces": CLEAN_CONLL.replace("\n\n", "\n  \t\n"),
    "runs_of_blank_lines": "\n\n" + CLEAN_CONLL.replace("\n\n", "\n\n\n\n"),
    "no_final_newline": CLEAN_CONLL.rstrip("\n"),
    "docstart_lines": "-DOCSTART- O\n\n" + CLEAN_CONLL.replace("Ann10 ", "-DOCSTART- O\n\nAnn10 "),
    "tabs": CLEAN_CONLL.replace(" ", "\t"),
}.items(), ids=lambda v: v[0] if isinstance(v, tuple) else v)
def test_blank_lines_written_in_other_ways_give_the_same_sentences(tmp_path, variant):
    name, text = variant
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "r.conll").write_text(CLEAN_CONLL)
    (tmp_path / "r.conll").write_bytes(text.encode())
    stats, out = prepare(tmp_path, task_config("token", "r.conll"))
    _, clean = prepare(tmp_path, task_config("token", "clean/r.conll"), "clean")
    assert sum(stats["examples"].values()) == 30
    assert _splits(out) == _splits(clean)


def test_entities_longer_than_the_span_limit_are_counted(tmp_path):
    rows = [{"tokens": ["Ann", "Lee", "met", "the", "Bank", "of", "the", "Republic", "of", "Ghana", str(i)],
             "tags": ["B-PER", "I-PER", "O", "O", "B-ORG", "I-ORG", "I-ORG", "I-ORG", "I-ORG", "I-ORG",
                      "O"]} for i in range(30)]
    write_jsonl(tmp_path / "s.jsonl", rows)
    stats, _ = prepare(tmp_path, task_config("span", "s.jsonl", max_span_words=4))
    assert stats["changed"]["entities_over_max_span_words"] == 30  # each ORG: 6 words, never found


def test_unseen_label_in_test_is_named(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    write_csv(folder / "train.csv", [{"text": f"t {i}", "label": "ab"[i % 2]} for i in range(10)])
    write_csv(folder / "valid.csv", [{"text": "v", "label": "a"}])
    write_csv(folder / "test.csv", [{"text": "w", "label": "a"}, {"text": "x", "label": "c"}])
    with pytest.raises(DataError, match=r"test.csv:3 \(row 2\): label 'c' in test never occurs"):
        prepare(tmp_path, task_config("classification", "f"))


def test_data_contract_runs_on_written_splits(tmp_path):
    """The GX suite is the last line: a table that slipped past the row checks still fails."""
    bad = pa.table({"text": ["fine", " "], "label": ["a", "z"]})
    with pytest.raises(ValidationError, match="label") as info:
        checks.validate_split(bad, "classification", ["a", "b"], tmp_path / "train.parquet")
    assert "text_chars" in str(info.value)
    tags = pa.table({"tokens": [["a", "b"]], "tags": [["I-PER", "O"]]},
                    schema=SCHEMAS["token"])
    with pytest.raises(ValidationError, match="bad_starts"):
        checks.validate_split(tags, "token", ["PER"], tmp_path / "train.parquet")


def test_config_mistakes(tmp_path):
    write_csv(tmp_path / "r.csv", reviews(10))
    with pytest.raises(ConfigError, match="unknown role"):
        prepare(tmp_path, task_config("classification", "r.csv", columns={"sentence": "review"}))
    with pytest.raises(ConfigError, match="entity types"):
        prepare(tmp_path, task_config("token", "r.csv", labels=["B-PER", "O"]))
    with pytest.raises(ConfigError, match="is a pair task"):
        prepare(tmp_path, task_config("classification", "news-order"))


# ----------------------------------------------------------------------------- built-ins

@pytest.fixture(scope="module")
def builtins(tmp_path_factory) -> dict[str, tuple[dict, Path]]:
    """Every default task prepared once from the real packages, whole (the defaults sample some
    training splits): name -> (stats, folder)."""
    out = tmp_path_factory.mktemp("tasks")
    return {name: (prepare_task(name, task.model_copy(update={"max_train_examples": 0}), out, PACKAGES,
                                out / name),
                   out / name) for name, task in section(FinetuneConfig).tasks.items()}


def texts_of(folder: Path, *columns: str) -> dict[str, set[str]]:
    """The texts of each split (all the given columns together)."""
    return {s: {t for c in columns for t in read_split(folder, s)[c].to_pylist()} for s in SPLITS}


def disjoint(sets: dict[str, set]) -> bool:
    """No element is in two of the sets."""
    return sum(map(len, sets.values())) == len(set().union(*sets.values()))


def test_movie_sentiment(builtins):
    stats, out = builtins["movie-sentiment"]
    assert stats["dropped"] == {"neutral_score": 37, "duplicate_text": 2}
    assert sum(stats["examples"].values()) == 10_605 - 37 - 2
    assert stats["examples"] == {"train": 8452, "valid": 1057, "test": 1057}
    assert read_meta(out)["labels"] == ["negative", "positive"]
    assert disjoint(texts_of(out, "text"))


def test_trec6(builtins):
    stats, out = builtins["trec-6"]
    # 5,382 distinct lines; one question is listed under two labels: 5,381 questions.
    assert stats["dropped"] == {"duplicate_line": 15_452 - 5_382, "conflicting_label": 1}
    assert stats["examples"] == {"train": 4305, "valid": 538, "test": 538}
    assert read_meta(out)["labels"] == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert disjoint(texts_of(out, "text"))


def test_bbc_news(builtins):
    stats, out = builtins["bbc-news"]
    assert stats["dropped"] == {"duplicate_text": 100}
    assert sum(stats["examples"].values()) == 2_225 - 100
    assert len(read_meta(out)["labels"]) == 5
    assert disjoint(texts_of(out, "text"))  # no test article in train


@pytest.mark.parametrize("name", ["conll2003-ner", "conll2003-ner-span"])
def test_conll2003(builtins, name):
    stats, out = builtins[name]
    assert stats["examples"] == {"train": 14_041, "valid": 3_250, "test": 3_453}
    assert read_meta(out) == {"task": name, "kind": "span" if name.endswith("span") else "token",
                              "labels": ["LOC", "MISC", "ORG", "PER"], "scheme": "bio"}
    assert stats["label_counts"]["train"] == {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}


def test_trec_same_type(builtins):
    stats, out = builtins["trec-same-type"]
    assert stats["examples"] == builtins["trec-6"][0]["examples"]  # one pair per question
    assert disjoint(texts_of(out, "text_a", "text_b"))  # no question in two splits
    for split, counts in stats["label_counts"].items():
        assert abs(counts["same"] - counts["different"]) <= 1, split
    # A `same` pair really shares the fine type (both questions' labels from the source file).
    fine = {q["text"]: q["fine"] for q in builtin._trec_questions(
        builtin.Context("x", task_config("pair", "trec-same-type"), Path("."), PACKAGES))}
    for row in read_split(out, "valid").to_pylist():
        assert (fine[row["text_a"]] == fine[row["text_b"]]) == (row["label"] == "same")


def test_news_order(builtins):
    stats, out = builtins["news-order"]
    assert set(stats["label_counts"]["train"]) == {"ordered", "swapped"}
    for counts in stats["label_counts"].values():
        assert abs(counts["ordered"] - counts["swapped"]) <= 1
    # The articles behind each split's pairs (the loader names them) never meet.
    ctx = builtin.Context("news-order", task_config("pair", "news-order"), Path("."), PACKAGES)
    loaded = builtin._news_order(ctx)
    articles = {s: {ex["_where"].split(", sentences")[0] for ex in loaded[s]} for s in SPLITS}
    assert disjoint(articles)
    assert {s: len(loaded[s]) for s in SPLITS} == stats["examples"]
    per_article = max(sum(ex["_where"].startswith(a + ",") for ex in loaded["test"])
                      for a in articles["test"])
    assert per_article <= builtin.PAIRS_PER_ARTICLE
