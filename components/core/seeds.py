"""Stable seeds and hashes derived from several parts (a seed, a split, a shard, a step...).

Python's hash() changes between processes; these don't, so a worker process, a resumed run and
another machine derive the same numbers. One helper for all: the held-out choice of clean, the
generator of each pairs shard, and every batch, mask and dropout draw of training.
"""

from __future__ import annotations

import hashlib


def stable_hash(*parts: object) -> int:
    """An unsigned 64-bit hash of the parts joined by ':' (`stable_hash(0, "doc-1")`)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def mix(*parts: object) -> int:
    """A 63-bit seed from the parts: fits every generator's seed (torch wants < 2**63)."""
    return stable_hash(*parts) >> 1
