"""Stage evaluate: metrics against hand-computed values, conlleval span rules, the table, the writers."""

from __future__ import annotations

import csv
import random

import pytest

from components.data.tags import bio_to_spans
from components.evaluation.baseline import most_frequent_tag, tfidf_baseline
from components.evaluation.metrics import (
    classification_metrics,
    entity_metrics,
    plain_tag_metrics,
    score_predictions,
    tag_metrics,
    word_accuracy,
)
from components.evaluation.plots import count_colour, write_confusion, write_curves, write_per_class
from components.evaluation.tables import (
    arm_lr,
    arm_steps,
    compare_transfer,
    cost_cells,
    fits_by_init,
    summarize,
    transfer_table,
)

# A 3-class example, rows = true, columns = predicted:
#            pred a  pred b  pred c   | true total t_k
#   true a      3       1       0     |   4
#   true b      0       2       1     |   3
#   true c      2       0       1     |   3
#   pred p_k    5       3       2     |  s = 10, trace c = 6
CONFUSION = [[3, 1, 0], [0, 2, 1], [2, 0, 1]]
LABELS = ["a", "b", "c"]


def _pairs_from(confusion: list[list[int]], labels: list[str]) -> tuple[list[str], list[str]]:
    y_true, y_pred = [], []
    for i, row in enumerate(confusion):
        for j, count in enumerate(row):
            y_true += [labels[i]] * count
            y_pred += [labels[j]] * count
    return y_true, y_pred


def test_classification_metrics_by_hand():
    y_true, y_pred = _pairs_from(CONFUSION, LABELS)
    m = classification_metrics(y_true, y_pred, LABELS)
    assert m["confusion"] == CONFUSION
    assert m["labels"] == LABELS
    assert m["accuracy"] == pytest.approx(6 / 10)  # trace / total
    # a: P = 3/5, R = 3/4, F1 = 2*3 / (5 + 4) = 2/3
    # b: P = 2/3, R = 2/3, F1 = 2/3
    # c: P = 1/2, R = 1/3, F1 = 2*1 / (2 + 3) = 2/5
    expected = {"a": (3 / 5, 3 / 4, 2 / 3, 4), "b": (2 / 3, 2 / 3, 2 / 3, 3), "c": (1 / 2, 1 / 3, 2 / 5, 3)}
    for label, (p, r, f, support) in expected.items():
        got = m["per_class"][label]
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p, r, f))
        assert got["support"] == support
    # macro F1 = (2/3 + 2/3 + 2/5) / 3 = (10/15 + 10/15 + 6/15) / 3 = 26/45
    assert m["macro_f1"] == pytest.approx(26 / 45)
    # Gorodkin: numerator c*s - sum p_k t_k = 6*10 - (5*4 + 3*3 + 2*3) = 60 - 35 = 25
    #   s^2 - sum p_k^2 = 100 - (25 + 9 + 4) = 62;  s^2 - sum t_k^2 = 100 - (16 + 9 + 9) = 66
    #   MCC = 25 / sqrt(62 * 66) = 25 / sqrt(4092) ≈ 0.39081
    assert m["mcc"] == pytest.approx(25 / 4092 ** 0.5)
    assert m["mcc"] == pytest.approx(0.39081, abs=1e-5)


def test_classification_metrics_edge_cases():
    perfect = classification_metrics(["x", "y", "x"], ["x", "y", "x"], ["x", "y"])
    assert perfect["accuracy"] == perfect["macro_f1"] == perfect["mcc"] == 1.0
    # Always predicting one class: MCC's denominator is 0 (s^2 - sum p^2 = 0), so 0 as in sklearn;
    # the never-predicted class has P = 0 (no predictions), R = 0, F1 = 0.
    constant = classification_metrics(["x", "y", "y"], ["y", "y", "y"], ["x", "y"])
    assert constant["mcc"] == 0.0
    assert constant["per_class"]["x"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    # A label asked for but absent from both sides still counts in the macro average (as a 0).
    assert classification_metrics(["x"], ["x"], ["x", "z"])["macro_f1"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not in"):
        classification_metrics(["x"], ["q"], ["x", "y"])
    with pytest.raises(ValueError):
        classification_metrics(["x", "y"], ["x"], ["x", "y"])


def test_classification_metrics_match_sklearn():
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

    rng = random.Random(0)
    labels = ["neg", "neu", "pos", "mixed"]
    for _ in range(20):
        n = rng.randint(5, 60)
        y_true = [rng.choice(labels) for _ in range(n)]
        # Noisy copies of the truth, so scores spread over the whole range.
        y_pred = [y if rng.random() < rng.random() else rng.choice(labels) for y in y_true]
        m = classification_metrics(y_true, y_pred, labels)
        assert m["mcc"] == pytest.approx(matthews_corrcoef(y_true, y_pred))
        assert m["macro_f1"] == pytest.approx(
            f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0))
        assert m["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
        assert m["confusion"] == confusion_matrix(y_true, y_pred, labels=labels).tolist()


@pytest.mark.parametrize(("tags", "spans"), [
    ([], []),
    (["O", "O"], []),
    (["B-PER", "I-PER", "O", "B-LOC"], [(0, 2, "PER"), (3, 4, "LOC")]),  # trailing entity closes at n
    (["O", "I-PER", "I-PER", "O"], [(1, 3, "PER")]),  # I- after O starts an entity
    (["I-ORG"], [(0, 1, "ORG")]),  # I- at the very start, too
    (["B-PER", "I-LOC", "I-LOC"], [(0, 1, "PER"), (1, 3, "LOC")]),  # I-X after B-Y: new entity
    (["B-PER", "I-PER", "I-LOC", "B-LOC"], [(0, 2, "PER"), (2, 3, "LOC"), (3, 4, "LOC")]),
    (["B-PER", "B-PER", "I-PER"], [(0, 1, "PER"), (1, 3, "PER")]),  # B- after B- of the same type
    (["B-MISC", "I-MISC", "I-MISC"], [(0, 3, "MISC")]),
    (["B-A-B", "I-A-B"], [(0, 2, "A-B")]),  # the type is everything after the first hyphen
])
def test_bio_to_spans_conlleval(tags, spans):
    assert bio_to_spans(tags) == spans


def test_bio_to_spans_rejects_malformed_tags():
    for bad in (["X"], ["B-"], ["E-PER"], ["b-PER"]):
        with pytest.raises(ValueError, match="not a BIO tag"):
            bio_to_spans(bad)


def _random_bio2(rng: random.Random, n: int) -> list[str]:
    """A valid BIO2 sequence: every entity begins with B-, I-X only continues an X."""
    tags: list[str] = []
    for _ in range(n):
        prev = tags[-1] if tags else "O"
        choices = ["O", "B-PER", "B-LOC", "B-ORG"]
        if prev != "O":
            choices += [f"I-{prev[2:]}"] * 2
        tags.append(rng.choice(choices))
    return tags


def test_spans_bio_round_trip():
    # BIO2 tags rebuilt from the spans (every entity begins with B-) are the tags read.
    rng = random.Random(1)
    for _ in range(500):
        tags = _random_bio2(rng, rng.randint(0, 25))
        spans = bio_to_spans(tags)
        rebuilt = ["O"] * len(tags)
        for start, end, kind in spans:
            rebuilt[start:end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        assert rebuilt == tags
        # Spans tile without overlap and in order.
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_entity_metrics_by_hand():
    gold = [
        [(0, 2, "PER"), (3, 4, "LOC")],
        [(1, 3, "ORG")],
        [],
    ]
    pred = [
        [(0, 2, "PER"), (3, 5, "LOC")],  # PER exact: hit; LOC one word too long: miss
        [(1, 3, "PER"), (1, 3, "PER")],  # right span, wrong type: miss; the duplicate counts once
        [(0, 1, "LOC")],  # spurious
    ]
    m = entity_metrics(gold, pred)
    # gold = 2 + 1 + 0 = 3, predicted = 2 + 1 + 1 = 4 (after dedup), hits = 1
    # P = 1/4, R = 1/3, F1 = 2*1 / (4 + 3) = 2/7
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((1 / 4, 1 / 3, 2 / 7))
    assert (m["support"], m["predicted"]) == (3, 4)
    # PER: gold 1, predicted 2 (one per sentence), hit 1 -> P 1/2, R 1, F1 2/3
    # LOC: gold 1, predicted 2, hit 0 -> 0, 0, 0;  ORG: gold 1, predicted 0 -> 0, 0, 0
    per = m["per_class"]
    assert set(per) == {"PER", "LOC", "ORG"}
    assert (per["PER"]["precision"], per["PER"]["recall"], per["PER"]["f1"]) == pytest.approx((0.5, 1, 2 / 3))
    assert per["PER"]["support"] == 1
    assert per["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert per["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_entity_metrics_from_tags_and_empty():
    gold = [bio_to_spans(["B-PER", "I-PER", "O", "B-LOC"])]
    assert entity_metrics(gold, gold)["f1"] == 1.0
    assert entity_metrics([[]], [[]])["f1"] == 0.0  # nothing to find: no score, not a crash
    with pytest.raises(ValueError):
        entity_metrics([[]], [])


def test_summarize():
    # mean of 1, 2, 3, 4 = 2.5; sample variance = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    s = summarize([1, 2, 3, 4])
    assert s["mean"] == 2.5 and s["n"] == 4 and s["values"] == [1.0, 2.0, 3.0, 4.0]
    assert s["std"] == pytest.approx((5 / 3) ** 0.5)
    assert summarize([0.7]) == {"mean": 0.7, "std": 0.0, "n": 1, "values": [0.7]}
    with pytest.raises(ValueError):
        summarize([])


def _table_rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]


def test_transfer_table_verdicts():
    rows = [
        # clear gain: 81.0 vs 71.0 -> +10.0 points, spread max(1.0, 1.0) = 1.0 -> helps
        {"task": "sst", "kind": "cls", "metric": "accuracy", "pretrained": summarize([0.80, 0.81, 0.82]),
         "scratch": summarize([0.70, 0.71, 0.72]), "baseline": 0.765,
         "lr": {"pretrained": 5e-4, "scratch": 1e-3}},
        # 81.0 ± 4.0 vs 80.0 ± 1.0 -> +1.0 points < 4.0 -> within seed spread
        {"task": "ner", "kind": "token", "metric": "entity_f1", "pretrained": summarize([0.77, 0.81, 0.85]),
         "scratch": summarize([0.79, 0.80, 0.81]), "baseline": None},
        # 60.0 vs 70.0 -> -10.0 points, beyond the 1.0 spread -> hurts
        {"task": "rte", "kind": "pair", "metric": "accuracy", "pretrained": summarize([0.59, 0.60, 0.61]),
         "scratch": summarize([0.69, 0.70, 0.71]), "baseline": 0.5},
        # no from-scratch run: nothing to compare
        {"task": "squad", "kind": "span", "metric": "f1", "pretrained": summarize([0.5]),
         "scratch": None, "baseline": None},
    ]
    table = transfer_table(rows)
    lines = table.strip().splitlines()
    assert lines[0] == ("| task | kind | metric | pretrained | from scratch | gain | lr | baseline | "
                        "verdict |")
    assert lines[1].count("---") == 9
    body = _table_rows(table)
    assert body[0] == ["sst", "cls", "accuracy", "81.0 ± 1.0", "71.0 ± 1.0", "+10.0", "0.0005 / 0.001",
                       "76.5", "pretraining helps†"]
    assert body[1] == ["ner", "token", "entity_f1", "81.0 ± 4.0", "80.0 ± 1.0", "+1.0", "—", "—",
                       "within seed spread†"]
    assert body[2][5:] == ["-10.0", "—", "50.0", "pretraining hurts†"]
    assert body[3] == ["squad", "span", "f1", "50.0 ± 0.0", "—", "—", "—", "—", "—"]


@pytest.mark.parametrize("encoder_spread, said", [
    (None, "pretraining helps†"),  # +3.0 points beyond the seeds' 1.0: the seeds alone
    (1.5, "pretraining helps"),  # beyond 1.0 + 1.5
    (2.5, "within both spreads"),  # not beyond 1.0 + 2.5: two encoders differ this much
])
def test_a_gain_must_clear_the_encoder_spread_too(encoder_spread, said):
    row = {"task": "t", "kind": "cls", "metric": "accuracy", "pretrained": summarize([0.82, 0.83, 0.84]),
           "scratch": summarize([0.79, 0.80, 0.81]), "baseline": None, "encoder_spread": encoder_spread}
    assert _table_rows(transfer_table([row]))[0][-1] == said


def test_transfer_table_single_seed_is_flagged():
    row = {"task": "t", "kind": "cls", "metric": "accuracy", "pretrained": summarize([0.9]),
           "scratch": summarize([0.8]), "baseline": None}
    assert _table_rows(transfer_table([row]))[0][-1] == "pretraining helps† (single seed: spread unknown)"


def test_the_checkpoint_arm_gets_its_column_and_what_continued_pretraining_added():
    row = {"task": "t", "kind": "cls", "metric": "accuracy", "pretrained": summarize([0.90, 0.92]),
           "checkpoint": summarize([0.86, 0.88]), "scratch": summarize([0.70, 0.72]), "baseline": None}
    lines = transfer_table([row]).splitlines()
    assert lines[0] == ("| task | kind | metric | pretrained | checkpoint as is | from scratch | gain | "
                        "vs checkpoint | lr | baseline | verdict |")
    assert _table_rows("\n".join(lines))[0][3:8] == ["91.0 ± 1.4", "87.0 ± 1.4", "71.0 ± 1.4",
                                                      "+20.0", "+4.0"]
    assert _table_rows("\n".join(lines))[0][-1] == "pretraining helps†; continued pretraining helps"


@pytest.mark.parametrize("checkpoint, said", [
    ([0.90, 0.93], "continued pretraining within seed spread"),  # +0.5 points, std 2.1
    ([0.95, 0.96], "continued pretraining hurts"),  # -4.5 points beyond std 1.4
])
def test_the_verdict_says_what_continued_pretraining_added(checkpoint, said):
    row = {"task": "t", "kind": "cls", "metric": "accuracy", "pretrained": summarize([0.90, 0.92]),
           "checkpoint": summarize(checkpoint), "scratch": summarize([0.70, 0.72]), "baseline": None}
    assert _table_rows(transfer_table([row]))[0][-1] == f"pretraining helps†; {said}"


def test_what_each_start_cost_is_steps_per_fit_by_init():
    # evaluate_stats.json's fits: each fit's scores, steps and rate.
    fits = {"pretrained-s1": {"accuracy": 0.9, "steps": 400, "lr": 5e-4},
            "pretrained-s2": {"accuracy": 0.8, "steps": 500, "lr": 5e-4},
            "scratch-s1": {"accuracy": 0.7, "steps": 1250, "lr": 1e-3}}
    steps = arm_steps(fits_by_init(fits))
    assert steps["pretrained"]["mean"] == 450 and steps["scratch"]["values"] == [1250]
    assert arm_lr(fits_by_init(fits)) == {"pretrained": 5e-4, "scratch": 1e-3}
    rows = [{"task": "a", "pretrained": summarize([0.9]), "scratch": summarize([0.8]), "steps": steps},
            {"task": "b", "pretrained": summarize([0.9]), "scratch": summarize([0.8]), "steps": {}}]
    header, cells = cost_cells(rows)
    assert header == ["task", "pretrained", "from scratch"]
    assert cells == [["a", "450 ± 71", "1,250 ± 0"]]  # b: not measured, no row


def test_compare_puts_runs_side_by_side_and_marks_what_a_run_lacks():
    mini = {"a": {"metric": "accuracy", "pretrained": summarize([0.8]), "scratch": summarize([0.7])},
            "b": {"metric": "entity_f1", "pretrained": summarize([0.5]), "scratch": None}}
    minilm = {"a": {"metric": "accuracy", "pretrained": summarize([0.9]),
                    "checkpoint": summarize([0.85]), "scratch": summarize([0.6])}}
    table = compare_transfer({"mini": mini, "minilm": minilm})
    assert table.splitlines()[0] == ("| task | metric | mini pretrained | mini from scratch | "
                                     "minilm pretrained | minilm checkpoint as is | minilm from scratch |")
    assert _table_rows(table) == [["a", "accuracy", "80.0 ± 0.0", "70.0 ± 0.0", "90.0 ± 0.0", "85.0 ± 0.0",
                                   "60.0 ± 0.0"],
                                  ["b", "entity_f1", "50.0 ± 0.0", "—", "—", "—", "—"]]


def test_most_frequent_tag_per_word_with_the_overall_tag_for_unknown_words():
    words = [["the", "run", "ended"], ["dogs", "run", "fast"], ["cats", "run", "far"]]
    tags = [["DET", "NOUN", "VERB"], ["NOUN", "VERB", "ADV"], ["NOUN", "VERB", "ADV"]]
    # run: VERB twice, NOUN once; "birds" unseen: NOUN, the most frequent tag overall (4 of 9).
    assert most_frequent_tag(words, tags, [["the", "run"], ["birds", "fast"]]) == \
        [["DET", "VERB"], ["NOUN", "ADV"]]
    assert most_frequent_tag([["a"], ["a"]], [["X"], ["Y"]], [["a"]]) == [["X"]]  # tie: first seen
    with pytest.raises(ValueError, match="2 words but 1 tags"):
        most_frequent_tag([["a", "b"]], [["X"]], [])


def test_plain_tags_are_scored_per_word_and_bio_tags_get_word_accuracy_too():
    import pyarrow as pa

    gold = [["DET", "NOUN", "VERB"], ["NOUN", "VERB"]]
    pred = [["DET", "VERB", "VERB"], ["NOUN", "VERB"]]
    m = plain_tag_metrics(gold, pred, ["NOUN", "VERB", "DET"])
    assert m["accuracy"] == pytest.approx(4 / 5) == word_accuracy(gold, pred)
    # NOUN: P 1/1, R 1/2 -> F1 2/3; VERB: P 2/3, R 1 -> F1 4/5; DET: 1.
    assert m["macro_f1"] == pytest.approx((2 / 3 + 4 / 5 + 1) / 3)
    assert m["confusion"] == [[1, 1, 0], [0, 2, 0], [0, 0, 1]]  # rows gold, columns predicted
    with pytest.raises(ValueError, match="differ in sentences or words"):
        word_accuracy(gold, [["DET"], ["NOUN", "VERB"]])
    table = pa.table({"tags": gold})
    plain = score_predictions("token", ["NOUN", "VERB", "DET"], table, pa.table({"pred_tags": pred}), "plain")
    assert plain["word_accuracy"] == pytest.approx(0.8) and "entity_f1" not in plain
    bio_gold = [["B-PER", "I-PER", "O"]]
    bio = score_predictions("token", ["PER"], pa.table({"tags": bio_gold}),
                            pa.table({"pred_tags": [["B-PER", "O", "O"]]}), "bio")
    assert bio["entity_f1"] == 0.0 and bio["word_accuracy"] == pytest.approx(2 / 3)


def test_tfidf_baseline_learns_separable_toy():
    pos = ["great good film", "good fun great", "wonderful great acting", "good good plot"]
    neg = ["bad awful film", "awful boring bad", "terrible bad acting", "boring awful plot"]
    texts, labels = pos + neg, ["pos"] * 4 + ["neg"] * 4
    test = ["a great good movie", "an awful bad movie", "good [SEP] great", "bad [SEP] boring"]
    assert tfidf_baseline(texts, labels, test, seed=0) == ["pos", "neg", "pos", "neg"]
    assert tfidf_baseline(texts, labels, test, seed=0) == tfidf_baseline(texts, labels, test, seed=1)
    assert tfidf_baseline(["x y", "y z"], ["only", "only"], ["z"], seed=0) == ["only"]


def _read_csv(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _no_temp_files(folder) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_write_confusion(tmp_path):
    y_true, y_pred = _pairs_from(CONFUSION, LABELS)
    metrics = classification_metrics(y_true, y_pred, LABELS)
    write_confusion(metrics, tmp_path / "confusion.png", tmp_path / "confusion.csv")
    rows = _read_csv(tmp_path / "confusion.csv")
    assert len(rows) == 9  # one per cell, zeros included
    assert {(r["actual"], r["predicted"]): int(r["count"]) for r in rows} == {
        (a, p): CONFUSION[i][j] for i, a in enumerate(LABELS) for j, p in enumerate(LABELS)}
    assert _is_png(tmp_path / "confusion.png")
    assert _no_temp_files(tmp_path)


def test_confusion_counts_are_readable_on_every_cell():
    # The colour scale runs from the matrix's minimum: with counts 90..100 the lowest cell is
    # near-white, where a rule on the counts (white above half the maximum) drew white text.
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    blues, norm = colormaps["Blues"], Normalize(90, 100)
    assert count_colour(blues(norm(90))) == "black" and count_colour(blues(norm(100))) == "white"
    assert count_colour((1.0, 1.0, 1.0, 1.0)) == "black" and count_colour((0.0, 0.0, 0.3, 1.0)) == "white"


def test_write_per_class(tmp_path):
    per_class = {"PER": {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1},
                 "LOC, city": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}}
    write_per_class(per_class, tmp_path / "per_class.png", tmp_path / "per_class.csv")
    rows = _read_csv(tmp_path / "per_class.csv")
    assert list(rows[0]) == ["label", "precision", "recall", "f1", "support"]
    assert [r["label"] for r in rows] == ["PER", "LOC, city"]  # a comma in a label survives quoting
    assert float(rows[0]["f1"]) == pytest.approx(2 / 3, abs=1e-5)
    assert rows[1]["support"] == "2"
    assert _is_png(tmp_path / "per_class.png")
    assert _no_temp_files(tmp_path)


def test_write_curves(tmp_path):
    histories = {
        "pretrained-s1": [{"step": 10, "epoch": 0.5, "val_metric": 0.6, "train_loss": 1.2},
                          {"step": 20, "epoch": 1.0, "val_metric": 0.7, "train_loss": 0.9}],
        "scratch-s1": [{"step": 10, "epoch": 0.5, "val_metric": 0.4, "train_loss": 1.5}],
    }
    write_curves(histories, tmp_path / "out" / "curves.png", tmp_path / "out" / "curves.csv")
    rows = _read_csv(tmp_path / "out" / "curves.csv")
    assert list(rows[0]) == ["fit", "step", "epoch", "val_metric", "train_loss"]
    assert [(r["fit"], int(r["step"])) for r in rows] == [
        ("pretrained-s1", 10), ("pretrained-s1", 20), ("scratch-s1", 10)]
    assert float(rows[1]["val_metric"]) == 0.7 and float(rows[2]["train_loss"]) == 1.5
    assert _is_png(tmp_path / "out" / "curves.png")
    assert _no_temp_files(tmp_path / "out")


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, components.evaluation.metrics, components.evaluation.tables; "
            "print(any(m.split('.')[0] in ('matplotlib', 'sklearn') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _random_tags(rng: random.Random, n: int) -> list[str]:
    """Any BIO sequence, IOB1 included (I- after O or after another type)."""
    return [rng.choice(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]) for _ in range(n)]


def test_bio_to_spans_follows_the_same_rules_as_seqeval():
    # seqeval's default mode is conlleval's reading; serving keeps our light copy of it.
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(2)
    for _ in range(500):
        tags = _random_tags(rng, rng.randint(0, 20))
        assert bio_to_spans(tags) == [(s, e + 1, t) for t, s, e in get_entities(tags)], tags


def test_tag_metrics_equal_span_set_metrics_where_both_apply():
    # Token tasks are scored by seqeval, span tasks by set matching: one definition, two readers.
    rng = random.Random(3)
    for _ in range(30):
        gold = [_random_tags(rng, rng.randint(1, 15)) for _ in range(rng.randint(1, 8))]
        pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC"]) for t in g] for g in gold]
        by_tags = tag_metrics(gold, pred)
        by_spans = entity_metrics([bio_to_spans(g) for g in gold], [bio_to_spans(p) for p in pred])
        for key in ("precision", "recall", "f1"):
            assert by_tags[key] == pytest.approx(by_spans[key]), key
        assert (by_tags["support"], by_tags["predicted"]) == (by_spans["support"], by_spans["predicted"])
        assert by_tags["per_class"].keys() == by_spans["per_class"].keys()
        for kind, m in by_tags["per_class"].items():
            assert m == pytest.approx(by_spans["per_class"][kind]), kind
