"""The bag-of-words reference of text tasks: TF-IDF + logistic regression on the same splits."""

from __future__ import annotations

from collections.abc import Sequence


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
