"""Deterministic token ids for documents and queries of a trace.

Traces give token counts, not text. The reference engine needs real ids, and KV reuse is only
real if a document has the same ids every time it is retrieved: a document's ids are drawn from
a generator seeded by its id, a query's by its request id. The seed is a hash of the id's text
(stable across processes, unlike Python's ``hash``), with a different prefix for documents and
queries so that document 7 and request 7 do not share tokens.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _seed(kind: str, key: object) -> int:
    digest = hashlib.blake2b(f"{kind}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _draw(kind: str, key: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    rng = np.random.default_rng(_seed(kind, key))
    return rng.integers(0, vocab_size, size=n_tokens, dtype=np.int64)


def document_token_ids(doc_id: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    """The ``n_tokens`` token ids of document ``doc_id``, each in ``[0, vocab_size)``.

    The same document id (int or str; ``7`` and ``"7"`` are the same document) always gives the
    same ids, in every process and on every machine, so a cached document's KV is exactly the
    KV that recomputing it would give.
    """
    return _draw("document", doc_id, n_tokens, vocab_size)


def query_token_ids(request_id: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    """The ``n_tokens`` token ids of the query of request ``request_id`` (see above)."""
    return _draw("query", request_id, n_tokens, vocab_size)
