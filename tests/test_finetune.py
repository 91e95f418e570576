"""Fine-tuning: subword/word alignment, span enumeration, the CRF, and every task kind trained
and scored on tiny models (real Lightning, real task files)."""

from __future__ import annotations

import itertools
import json
import os
import socket

import pyarrow as pa
import pytest
import torch

from components.model.config import IGNORE
from components.model.decoding import pick_spans, word_tags
from components.model.inputs import (
    align_words,
    collate,
    encode,
    enumerate_spans,
    fit_length,
    label_space,
    token_labels,
    windows,
)
from tests.conftest import section, task_config


@pytest.fixture(scope="module")
def wordpiece():
    """A hand-made WordPiece vocabulary in which `unbelievable` is three pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "un", "##believ", "##able",
             "smith", "is"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(vocab[:5])  # as the learned tokenizer registers them
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def test_a_word_in_three_pieces_is_aligned_labelled_and_decoded_by_its_first_piece(wordpiece):
    words, tags = ["john", "unbelievable", "smith"], ["B-PER", "O", "B-PER"]
    enc = wordpiece.encode(words, is_pretokenized=True)
    assert enc.tokens == ["[CLS]", "john", "un", "##believ", "##able", "smith", "[SEP]"]
    assert align_words(enc.word_ids, 3) == ([1, 2, 5], [1, 4, 5])

    space = label_space("token", ["PER"])
    assert space == ["O", "B-PER", "I-PER"]
    ids = [space.index(t) for t in tags]  # [1, 0, 1]
    # Every piece carries its word's tag; or only the first piece does; specials never do.
    assert token_labels(enc.word_ids, ids, "all") == [IGNORE, 1, 0, 0, 0, 1, IGNORE]
    assert token_labels(enc.word_ids, ids, "first") == [IGNORE, 1, 0, IGNORE, IGNORE, 1, IGNORE]

    (ex,) = encode(pa.table({"tokens": [words], "tags": [tags]}), "token", wordpiece, ["PER"], 16)
    batch = collate([ex], "token")
    assert batch["labels"].tolist() == [[IGNORE, 1, 0, 0, 0, 1, IGNORE]]
    # Emissions (1, T=7, C=3): the first piece of `unbelievable` says O, its other two pieces
    # say B-PER; the word's tag is the first piece's.
    emissions = torch.zeros(1, 7, 3)
    for pos, tag in [(1, 1), (2, 0), (3, 1), (4, 1), (5, 2)]:
        emissions[0, pos, tag] = 5.0
    assert word_tags(emissions, batch["word_first"], [3], space) == [["B-PER", "O", "I-PER"]]


def test_words_cut_by_truncation_are_tagged_o(wordpiece):
    words = ["john", "is", "unbelievable", "smith"]
    (ex,) = encode(pa.table({"tokens": [words], "tags": [["B-PER", "O", "O", "B-PER"]]}), "token",
                   wordpiece, ["PER"], max_len=5)  # [CLS] john is un [SEP]: `unbelievable` partly in
    assert ex.word_first == [1, 2, 3, -1]
    batch = collate([ex], "token")
    emissions = torch.zeros(1, 5, 3)
    emissions[0, :, 1] = 1.0  # B-PER everywhere
    assert word_tags(emissions, batch["word_first"], [4], label_space("token", ["PER"])) == \
        [["B-PER", "B-PER", "B-PER", "O"]]


def test_a_word_the_normaliser_erases_keeps_its_place(wordpiece):
    from tokenizers import normalizers

    # BERT's normaliser deletes format characters: a zero-width space would own no subword, and
    # every later word would take its neighbour's tag. It is encoded as [UNK] instead.
    wordpiece.normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=True)
    try:
        words, tags = ["john", "\u200b", "smith"], ["B-PER", "O", "B-PER"]
        (ex,) = encode(pa.table({"tokens": [words], "tags": [tags]}), "token", wordpiece, ["PER"], 16)
    finally:
        wordpiece.normalizer = None
    assert ex.word_first == [1, 2, 3] and ex.ids[2] == 1  # [UNK]
    emissions = torch.zeros(1, 5, 3)
    for pos, tag in [(1, 1), (2, 0), (3, 1)]:
        emissions[0, pos, tag] = 5.0
    assert word_tags(emissions, collate([ex], "token")["word_first"], [3],
                     label_space("token", ["PER"])) == [tags]


@pytest.mark.parametrize("n,L", [(n, L) for n in range(0, 13) for L in range(1, 6)])
def test_span_enumeration_count(n, L):
    spans = enumerate_spans(n, L)
    assert len(spans) == sum(n - w + 1 for w in range(1, min(L, n) + 1))
    assert len(set(spans)) == len(spans) and all(0 <= a <= b < n and b - a < L for a, b in spans)


def test_span_enumeration_by_hand_and_span_labels(wordpiece):
    assert enumerate_spans(4, 2) == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3), (3, 3)]
    words, tags = ["john", "smith", "is", "john"], ["B-PER", "I-PER", "O", "B-PER"]
    (ex,) = encode(pa.table({"tokens": [words], "tags": [tags]}), "span", wordpiece, ["PER"], 32,
                   max_span_words=2)
    labelled = {span for span, label in zip(ex.spans, ex.span_labels, strict=True) if label}
    assert labelled == {(0, 1), (3, 3)}  # "john smith" and the last "john"; NULL (0) elsewhere
    batch = collate([ex], "span")
    assert batch["span_width"][0, :len(ex.spans)].tolist() == [b - a for a, b in ex.spans]


def test_long_texts_keep_the_head_or_the_head_and_tail():
    ids = [2, *range(100, 120), 3]  # [CLS] 20 tokens [SEP]
    assert fit_length(ids, 10, "truncate") == [2, *range(100, 108), 3]
    # 8 kept: 2 from the head (1/4), 6 from the tail.
    assert fit_length(ids, 10, "head_tail") == [2, 100, 101, *range(114, 120), 3]
    assert fit_length(ids[:5], 10, "head_tail") == ids[:5]


def test_long_texts_in_windows_cover_every_subword_and_one_row_gets_one_prediction():
    ids = [2, *range(100, 120), 3]  # [CLS] 20 tokens [SEP]
    parts = windows(ids, 10, 2)  # 8 subwords a window, 6 new each: starts 0, 6, then 12 (the end)
    assert parts == [[2, *range(100, 108), 3], [2, *range(106, 114), 3], [2, *range(112, 120), 3]]
    assert windows(ids, 22, 2) == [ids] and windows(ids[:5], 10, 2) == [ids[:5]]
    # The windows' logits are averaged per row: row 0's two windows disagree, the mean decides.
    from components.model.decoding import labels_of
    from components.model.inputs import Encoded
    examples = [Encoded([2], [0], doc=0), Encoded([2], [0], doc=0), Encoded([2], [0], doc=1)]
    logits = [torch.tensor([3.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 2.0])]
    (label0, p0), (label1, _) = labels_of(logits, examples, ["neg", "pos"])
    assert (label0, label1) == ("neg", "pos") and p0 == pytest.approx(torch.sigmoid(torch.tensor(1.0)).item())


def test_greedy_span_decoding_keeps_the_best_non_overlapping():
    spans = [(0, 2, "PER", 0.9), (1, 3, "ORG", 0.95), (3, 4, "LOC", 0.6), (0, 1, "PER", 0.7)]
    assert pick_spans(spans, "greedy") == [(0, 1, "PER", 0.7), (1, 3, "ORG", 0.95), (3, 4, "LOC", 0.6)]
    assert pick_spans(spans, "nested") == sorted(spans)


def test_crf_viterbi_is_the_best_path_and_nll_normalises():
    from components.model.heads import CRF

    torch.manual_seed(0)
    crf = CRF(3)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    emissions = torch.randn(2, 4, 3)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])

    def path_score(b, path):
        s = crf.start[path[0]] + emissions[b, 0, path[0]] + crf.end[path[-1]]
        for w in range(1, len(path)):
            s = s + crf.transitions[path[w - 1], path[w]] + emissions[b, w, path[w]]
        return float(s.detach())

    for b, n in enumerate([4, 3]):
        paths = list(itertools.product(range(3), repeat=n))
        best = max(paths, key=lambda p: path_score(b, p))
        assert crf.viterbi(emissions, mask)[b] == list(best)
        # exp(-nll) of every path sums to one: the partition function is right.
        total = 0.0
        for p in paths:
            tags = torch.tensor([list(p) + [0] * (4 - n)])
            total += float(torch.exp(-crf.nll(emissions[b:b + 1], tags, mask[b:b + 1])))
        assert total == pytest.approx(1.0, rel=1e-4)


BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _valid(path: list[str]) -> bool:
    """What a BIO reader accepts: each I-X right after a B-X or an I-X."""
    return all(t[:2] != "I-" or (i and path[i - 1][2:] == t[2:] and path[i - 1] != "O")
               for i, t in enumerate(path))


def test_bio_forbidden_marks_what_no_bio_reader_accepts():
    from components.model.decoding import bio_forbidden

    start, moves = bio_forbidden(BIO)
    assert [t for t, s in zip(BIO, start.tolist(), strict=True) if s == float("-inf")] == ["I-PER", "I-LOC"]
    allowed = {(a, b) for i, a in enumerate(BIO) for j, b in enumerate(BIO) if moves[i, j] == 0}
    assert {(a, b) for a, b in allowed if b == "I-PER"} == {("B-PER", "I-PER"), ("I-PER", "I-PER")}
    assert all((a, b) in allowed for a in BIO for b in BIO if b[:2] != "I-")
    assert bio_forbidden(["NN", "VB", "DT"]) is None and bio_forbidden(["O", "B-X"]) is None


@pytest.mark.parametrize("with_crf", [False, True])
def test_valid_decoding_is_the_best_sequence_a_bio_reader_accepts(with_crf):
    """Brute force over every tag sequence: `valid` decoding finds the best valid one, where
    `free` decoding (each word's argmax, or the CRF's unconstrained path) is often invalid."""
    from components.model.decoding import word_tags
    from components.model.heads import CRF

    torch.manual_seed(0)
    crf = CRF(len(BIO)) if with_crf else None
    if crf is not None:
        with torch.no_grad():
            for p in crf.parameters():
                p.normal_()
    B, W = 40, 4
    emissions = 3 * torch.randn(B, W, len(BIO))  # one subword per word: T = W
    word_first = torch.arange(W).expand(B, W).clone()
    word_first[1, 3] = -1  # a row with a word cut by truncation
    n_words = [W] * B

    def score(b: int, path: tuple[int, ...]) -> float:
        if crf is None:
            return float(emissions[b].log_softmax(-1)[range(len(path)), list(path)].sum())
        s = crf.start[path[0]] + crf.end[path[-1]] + sum(emissions[b, w, t] for w, t in enumerate(path))
        return float(s + sum(crf.transitions[a, c] for a, c in itertools.pairwise(path)))

    valid = word_tags(emissions, word_first, n_words, BIO, crf, "valid")
    free = word_tags(emissions, word_first, n_words, BIO, crf, "free")
    for b in range(B):
        n = int((word_first[b] >= 0).sum())
        paths = [p for p in itertools.product(range(len(BIO)), repeat=n) if _valid([BIO[t] for t in p])]
        best = max(paths, key=lambda p: score(b, p))
        assert valid[b] == [BIO[t] for t in best] + ["O"] * (W - n)
    assert sum(not _valid(p) for p in free) > 0  # the test's emissions do make invalid paths


# ------------------------------------------------------------------ every kind, end to end

def test_loading_an_encoder_leaves_the_random_stream_alone(tiny_encoder):
    """Arms of one seed differ only in their start: the draws after the model is built (dropout,
    data order) are the same with pretrained weights and from scratch."""
    from components.model.build import task_model
    from components.model.metadata import read_encoder_info
    from components.training.finetune_module import load_encoder_weights

    cfg = read_encoder_info(tiny_encoder).config
    draws = []
    for pretrained in (True, False):
        torch.manual_seed(3)
        model = task_model(cfg, "classification", ["neg", "pos"])
        if pretrained:
            load_encoder_weights(model, tiny_encoder, cfg)
        draws.append(torch.rand(4))
    assert torch.equal(*draws)


def test_workers_0_runs_three_fits_on_two_cores_at_once_with_a_thread_each(monkeypatch):
    # Two workers would fit seeds 1 and 2, then seed 3 alone with a core idle: 2 fits' time.
    from components.training.workers import threads_per_worker, worker_count

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert worker_count(0, 3) == 3 and threads_per_worker(3) == 1  # a thread each: the same bits
    assert worker_count(0, 2) == 2 and threads_per_worker(2) == 1
    assert worker_count(0, 8) == 3  # at most 1.5 a core: each process costs its imports and memory
    assert worker_count(1, 3) == 1  # an explicit count is kept
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert worker_count(0, 3) == 3 and threads_per_worker(3) == 5  # many cores: split, as before


@pytest.mark.slow
def test_fits_in_worker_processes_are_the_fits_of_one_process(tiny_encoder, tmp_path):
    # The suite fits in its own process (conftest's IN_PROCESS); a run's default spreads the
    # fits over worker processes, which must train and predict exactly what one process does.
    from components.core.config import FinetuneConfig
    from components.data.tasks.prepare import prepare_task
    from components.training.finetune import finetune_start
    from components.training.workers import threads_per_worker
    from tests.conftest import tree

    _user_files(tmp_path / "user")
    task = task_config("classification", "user/reviews.csv", columns={"text": "review", "label": "verdict"},
                       lr=3e-3, epochs=2)
    prepare_task("reviews", task, tmp_path, tmp_path / "packages", tmp_path / "task")
    cfg = section(FinetuneConfig, tasks={"reviews": task}, seeds=[1, 2], init=["pretrained", "scratch"],
                  batch_size=16, workers=2)

    def fits(cfg, out):
        """Each start's fits into a folder of its own under `out`, as its stage writes them."""
        return {init: finetune_start("reviews", task, cfg, init=init, task_dir=tmp_path / "task",
                                     encoder_dir=tiny_encoder, out_dir=out / init) for init in cfg.init}

    spread = fits(cfg, tmp_path / "spread")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_worker(2))  # each worker's share of the cores
    try:
        alone = fits(cfg.model_copy(update={"workers": 1}), tmp_path / "alone")
    finally:
        torch.set_num_threads(threads)
    for init in cfg.init:
        assert (spread[init].pop("this_run")["workers"], alone[init].pop("this_run")["workers"]) == (2, 1)
        # The record names the threads the fits ran on; this process was given a worker's share.
        assert spread[init]["machine"]["threads"] == threads_per_worker(2)
        assert set(spread[init]["fits"]) == {f"{init}-s1", f"{init}-s2"}
    assert spread == alone
    assert tree(tmp_path / "spread") == tree(tmp_path / "alone")  # the exported models and predictions


def _user_files(folder):
    """A keyword-sentiment CSV, a JSONL pair file, a CoNLL file of entities and one of plain
    tags (parts of speech), small and learnable."""
    import random

    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["review,verdict"]
    for i in range(240):
        good = i % 2 == 0
        word = rng.choice(["good", "great", "fine"] if good else ["bad", "awful", "poor"])
        rows.append(f"the film number {i} was {word},{'pos' if good else 'neg'}")
    (folder / "reviews.csv").write_text("\n".join(rows) + "\n")
    with (folder / "pairs.jsonl").open("w") as f:
        for i in range(160):
            a = f"the president spoke about taxes {i}"
            b = a if i % 2 else f"a storm hit the coast {i}"
            f.write(json.dumps({"text_a": a, "text_b": b, "label": "same" if i % 2 else "other"}) + "\n")
    lines = []
    for i in range(160):
        name = rng.choice(["Smith", "Jones", "Brown"])
        place = rng.choice(["Paris", "London", "Boston"])
        lines += [f"{name} B-PER", "visited O", f"{place} B-LOC", "in O", f"{1900 + i} O", ""]
    (folder / "ner.conll").write_text("\n".join(lines))
    # Plain tags where context decides: "run" is a VERB after "will" and a NOUN after an
    # adjective, half the time each, so each word's most frequent tag misses half of them.
    lines = []
    for i in range(160):
        if i % 2:
            lines += ["a DET", f"{rng.choice(['long', 'short', 'quick'])} ADJ", "run NOUN", "ended VERB", ""]
        else:
            lines += ["the DET", f"{rng.choice(['dog', 'cat', 'horse'])} NOUN", "will AUX", "run VERB", ""]
    (folder / "pos.conll").write_text("\n".join(lines))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["classic", "modern"])
def test_every_task_kind_trains_predicts_exports_and_is_scored(arch, request, tmp_path):
    tiny_encoder = request.getfixturevalue("tiny_encoder" if arch == "classic" else "tiny_modern_encoder")

    from safetensors.torch import load_file

    from components.core.config import EvaluateConfig, FinetuneConfig
    from components.core.io import write_json
    from components.data.tasks.folder import read_meta, read_split
    from components.data.tasks.prepare import prepare_task
    from components.data.tokenizer import load
    from components.evaluation.evaluate import evaluate_task
    from components.evaluation.transfer import transfer_report
    from components.model.build import task_model
    from components.model.decoding import predict
    from components.model.inputs import encode
    from components.model.metadata import read_task_model_info
    from components.training.finetune import finetune_start

    _user_files(tmp_path / "user")
    fast = {"lr": 3e-3, "epochs": 8, "patience": 16}
    tasks = {
        # Windows of 8 subwords: the verdict's word comes after the first window, only the
        # later windows hold it.
        "reviews": task_config("classification", "user/reviews.csv", max_seq_len=8,
                               long_text="chunks", chunk_overlap=2, **{**fast, "lr": 1e-3},
                               columns={"text": "review", "label": "verdict"}),
        "same-topic": task_config("pair", "user/pairs.jsonl", **fast),
        "ner": task_config("token", "user/ner.conll", **fast),
        "ner-span": task_config("span", "user/ner.conll", max_span_words=3, span_decoding="greedy",
                                **{**fast, "epochs": 16}),
        "pos": task_config("token", "user/pos.conll", **fast),  # plain tags (scheme auto)
    }
    cfg = section(FinetuneConfig, tasks=tasks, seeds=[1, 2], init=["pretrained", "scratch"], batch_size=16)
    trained = {}  # each task's fits, as the starts' stages recorded them
    for name, task in tasks.items():
        task_dir, model_dir = tmp_path / "tasks" / name, tmp_path / "models" / name
        prepare_task(name, task, tmp_path, tmp_path / "packages", task_dir)
        # The CRF path too, for BIO and plain tags; plain tags on first subwords only.
        # A modern ner trains without the CRF: its export goes to transformers, logits compared.
        crf = name == "pos" or (name == "ner" and arch == "classic")
        task_cfg = cfg.model_copy(update={"crf": crf, "label_subwords":
                                          "first" if name == "pos" else cfg.label_subwords})
        trained[name] = {}
        for init in cfg.init:  # a stage per start, each into a folder of its own
            stats = finetune_start(name, task, task_cfg, init=init, task_dir=task_dir,
                                   encoder_dir=tiny_encoder, out_dir=model_dir / init)
            assert set(stats["fits"]) == {f"{init}-s1", f"{init}-s2"}
            assert {f["lr"] for f in stats["fits"].values()} == set(task.lr)  # one rate: no search
            assert "search" not in stats
            if name == "reviews":  # every review is longer than one window
                assert stats["train_windows"] > stats["train_examples"]
            this_run = stats.pop("this_run")  # MLflow only, as run_stage does
            minutes = {f"{fit}.minutes" for fit in stats["fits"]}
            assert set(this_run) == {"workers", "cluster", "hosts", *minutes}
            assert this_run["cluster"] == "local" and this_run["hosts"] == socket.gethostname()
            assert not any("minutes" in fit for fit in stats["fits"].values())  # wall time is not an output
            # Every start exports its own first seed.
            assert read_task_model_info(model_dir / init / "model").fit == f"{init}-s1"
            trained[name].update(stats["fits"])
        metrics_dir = tmp_path / "metrics" / name
        evaluated = evaluate_task(name, task, section(EvaluateConfig), task_dir,
                                  {init: model_dir / init for init in cfg.init}, tiny_encoder, metrics_dir)
        assert evaluated["encoder"] == stats["encoder"]  # what pretraining reached, for the transfer table
        # Learnable by construction: every fit must have learned it, not only the chance level.
        assert set(evaluated["fits"]) == set(trained[name])
        for fit, metrics in evaluated["fits"].items():
            assert metrics[evaluated["metric"]] > 0.8, (name, fit, metrics)
            fitted = trained[name][fit]
            assert (metrics["steps"], metrics["lr"]) == (fitted["steps"], fitted["lr"])
        assert (tmp_path / "metrics" / name / "curves.csv").exists()
        if name == "pos":  # plain tags: a per-tag table and the confusion of the tags
            assert (metrics_dir / "per_class.csv").exists() and (metrics_dir / "confusion.csv").exists()
        write_json(tmp_path / "metrics" / name / "evaluate_stats.json", evaluated)  # as run_stage does

        # The exported model reloads from safetensors + bertflow.json and predicts the same.
        model_dir = model_dir / cfg.init[0]  # the first start's: the one the registry takes
        info = read_task_model_info(model_dir / "model")
        assert info.labels == read_meta(task_dir)["labels"] and info.fit == "pretrained-s1"
        model = task_model(info.config, task.kind, info.space, info.crf, task.max_span_words)
        model.load_state_dict(load_file(model_dir / "model" / "model.safetensors"))
        test = read_split(task_dir, "test")
        examples = encode(test, task.kind, load(model_dir / "model"), info.labels, info.max_seq_len,
                          task.long_text, max_span_words=task.max_span_words, scheme=info.scheme,
                          chunk_overlap=task.chunk_overlap)
        again = predict(model, task.kind, examples, info.space, 16, task.span_decoding, info.threshold,
                        task.tag_decoding)
        if arch == "modern" and task.kind != "span" and not crf:
            _same_logits_in_transformers(model, model_dir / "model", tmp_path / "hf" / name, examples)
        saved = pa.parquet.read_table(model_dir / "fits" / "pretrained-s1.parquet").to_pylist()
        if task.kind in ("classification", "pair"):
            assert [p[0] for p in again] == [r["pred"] for r in saved]
        elif task.kind == "token":
            assert again == [r["pred_tags"] for r in saved]
            assert info.scheme == "plain" or all(map(_valid, again))  # tag_decoding's default: valid
        else:
            assert [[s[:3] for s in row] for row in again] == \
                [[(s["start"], s["end"], s["label"]) for s in r["pred_spans"]] for r in saved]

    transfer_report(list(tasks), tmp_path / "metrics", tmp_path / "transfer.md", tmp_path / "transfer.json")
    table = (tmp_path / "transfer.md").read_text()
    assert all(f"| {name} |" in table for name in tasks)
    summary = json.loads((tmp_path / "transfer.json").read_text())
    assert summary["reviews"]["pretrained"]["n"] == 2 and summary["reviews"]["baseline"] > 0.9
    # Plain tags: word accuracy, against each word's most frequent tag, which context beats.
    pos = summary["pos"]
    assert (pos["metric"], pos["baseline_name"]) == ("word_accuracy", "most frequent tag")
    assert pos["baseline"] == pytest.approx(7 / 8, abs=0.05)
    assert pos["baseline"] < pos["pretrained"]["mean"]
    assert read_task_model_info(tmp_path / "models" / "pos" / "pretrained" / "model").scheme == "plain"
    assert summary["ner"]["baseline_name"] == "most frequent tag" and "*baseline*:" in table
    # What each start cost: steps per fit, by init, as the starts' stages took them (the table
    # reads them from each task's evaluate_stats.json).
    steps = summary["reviews"]["steps"]
    assert steps["scratch"]["values"] == [trained["reviews"][f"scratch-s{s}"]["steps"] for s in (1, 2)]
    cost = table.split("## What each start cost")[1]
    assert "| task | pretrained | from scratch |" in cost and all(f"| {n} |" in cost for n in tasks)


def _same_logits_in_transformers(model, model_dir, out, examples) -> None:
    """export-hf's folder loads in transformers (no missing or unexpected keys) and gives our
    task model's logits on a padded batch of real examples."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from components.lifecycle.hf_export import export_hf
    from components.model.inputs import collate

    kind = export_hf(model_dir, out)["kind"]
    auto = AutoModelForTokenClassification if kind == "token" else AutoModelForSequenceClassification
    hf, loading = auto.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__.startswith("ModernBert")
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    batch = collate(examples[:8], kind)
    with torch.no_grad():
        ours = model.eval()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        theirs = hf.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"] if kind == "token" else slice(None)
    assert torch.allclose(ours[real], theirs[real], atol=1e-4), (ours[real] - theirs[real]).abs().max()


def test_a_tiny_task_trains_its_minimum_steps_and_warns_below_its_baseline(tiny_encoder, tmp_path):
    # 64 rows at half for training: one step an epoch, 2 steps in all at the default epochs, which
    # learn nothing (54 +- 14 against TF-IDF's 100 once, and no word said). The fits take
    # finetune.min_steps (more epochs), and a model that still ends below the baseline says so.
    from components.core.config import EvaluateConfig, FinetuneConfig
    from components.data.tasks.prepare import prepare_task
    from components.evaluation.evaluate import evaluate_task
    from components.training.finetune import finetune_start

    rows = ["review,verdict"] + [f"the film number {i} was {'good' if i % 2 else 'awful'},"
                                 f"{'pos' if i % 2 else 'neg'}" for i in range(64)]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    task = task_config("classification", "reviews.csv", split=[0.5, 0.1, 0.4],
                       columns={"text": "review", "label": "verdict"}, lr=1e-9)
    prepare_task("reviews", task, tmp_path, tmp_path / "packages", tmp_path / "task")
    # A rate too small to learn anything: the fits stay at chance, TF-IDF reads the keyword.
    cfg = section(FinetuneConfig, tasks={"reviews": task}, seeds=[1], init=["pretrained"], min_steps=12,
                  workers=1)
    stats = finetune_start("reviews", task, cfg, init="pretrained", task_dir=tmp_path / "task",
                           encoder_dir=tiny_encoder, out_dir=tmp_path / "pretrained")
    assert stats["fits"]["pretrained-s1"]["steps"] >= 12
    # A start of finetune.init whose stage has not run is named, not scored as absent.
    with pytest.raises(FileNotFoundError, match=r"scratch/fits: no fine-tuning fits of the scratch start"):
        evaluate_task("reviews", task, section(EvaluateConfig), tmp_path / "task",
                      {"pretrained": tmp_path / "pretrained", "scratch": tmp_path / "scratch"}, tiny_encoder,
                      tmp_path / "metrics")
    evaluated = evaluate_task("reviews", task, section(EvaluateConfig), tmp_path / "task",
                              {"pretrained": tmp_path / "pretrained"}, tiny_encoder, tmp_path / "metrics")
    assert evaluated["baseline"]["accuracy"] == 1.0
    mean = evaluated["primary"]["pretrained"]["mean"]
    assert evaluated["warning"] == (f"the pretrained fits (accuracy {mean:.4f}) end below the TF-IDF + LR "
                                    "baseline (1.0000)")
