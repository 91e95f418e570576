"""The references a task's models are read against, trained on the same train split: TF-IDF +
logistic regression for text tasks, the most frequent tag of each word for token tasks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

TFIDF, MOST_FREQUENT_TAG = "TF-IDF + LR", "most frequent tag"  # their names in tables


def tfidf_baseline(train_texts: Sequence[str], train_labels: Sequence[str], test_texts: Sequence[str],
                   seed: int) -> list[str]:
    """Predicted labels of TF-IDF (word 1-2 grams, sublinear tf) + logistic regression."""
    if len(train_texts) != len(train_labels):
        raise ValueError(f"{len(train_texts)} texts but {len(train_labels)} labels")
    classes = sorted(set(train_labels))
    if len(classes) == 1:  # LogisticRegression refuses one class; the only sensible answer is it
        return [classes[0]] * len(test_texts)
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    features = vectorizer.fit_transform(list(train_texts))
    # C=10: weak regularisation suits the small, sparse task sets; lbfgs is deterministic, and
    # the seed only matters if the solver ever changes to a stochastic one.
    model = LogisticRegression(C=10.0, max_iter=1000, random_state=seed)
    model.fit(features, list(train_labels))
    if not len(test_texts):
        return []
    return [str(y) for y in model.predict(vectorizer.transform(list(test_texts)))]


def most_frequent_tag(train_words: Sequence[Sequence[str]], train_tags: Sequence[Sequence[str]],
                      test_words: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each test word's most frequent tag in train (ties: the tag first seen); a word train
    never saw gets the most frequent tag overall. The classic floor of a tagger: what knowing
    the words alone, without context, gets."""
    by_word: dict[str, Counter] = {}
    overall: Counter = Counter()
    for words, tags in zip(train_words, train_tags, strict=True):
        if len(words) != len(tags):
            raise ValueError(f"{len(words)} words but {len(tags)} tags in a train sentence")
        for word, tag in zip(words, tags, strict=True):
            by_word.setdefault(word, Counter())[tag] += 1
            overall[tag] += 1
    if not overall:
        raise ValueError("no tagged train words")
    best = {word: counts.most_common(1)[0][0] for word, counts in by_word.items()}
    fallback = overall.most_common(1)[0][0]
    return [[best.get(word, fallback) for word in words] for words in test_words]
