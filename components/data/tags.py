"""BIO tags and entity spans: the conlleval chunking rules, in both directions.

Used where entities are read (span-task gold from tags) and returned (served token models), so
it stays light: no scikit-learn at serving time. tests/test_evaluate.py checks it against
seqeval's get_entities, the reference implementation of the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence

Span = tuple[int, int, str]  # (start word, end word exclusive, type)


def _split_tag(tag: str) -> tuple[str, str]:
    """("B"|"I"|"O", type) of one BIO tag; a malformed tag is an error, not a silent O."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise ValueError(f"not a BIO tag: {tag!r}")
    return prefix, kind


def bio_to_spans(tags: Sequence[str]) -> list[Span]:
    """Entities of a BIO tag sequence with conlleval's rules (I-X after O or another type starts one)."""
    spans: list[Span] = []
    start, current = -1, ""  # the open entity, if start >= 0
    for i, tag in enumerate(tags):
        prefix, kind = _split_tag(tag)
        # conlleval: a chunk ends before O, before any B, and before an I of another type.
        if start >= 0 and (prefix != "I" or kind != current):
            spans.append((start, i, current))
            start = -1
        # ... and starts at any B, and at an I that does not continue the open chunk (IOB1-style).
        if prefix != "O" and start < 0:
            start, current = i, kind
    if start >= 0:
        spans.append((start, len(tags), current))
    return spans
