"""Workloads for the answer cache: repeated questions with a Zipf popularity and paraphrased
variants whose answer key is known.

A semantic tier is only honest on paraphrases with ground truth. ``with_questions`` takes any
trace (its documents, token counts and arrivals) and a question set, and gives request i a
question drawn by popularity — its text either verbatim or rewritten by a template that keeps
its meaning (``TEMPLATES``) — and that question's answer key. A request's documents are those
of the trace request its question maps to, so a repeated question retrieves the same documents.
``ragsim trace build --paraphrase-p`` draws its rewrites with ``draw_templates`` too (and
embeds and searches each rewrite as its own query). The rewrites are templated, not human
paraphrases: a semantic hit on them is easy, and false
hits come from distinct questions that are close to each other in the question set.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ragsim.traces.schema import Trace

TEMPLATES = (
    "Quick question: {q}",
    "{q} Do you know?",
    "Can you tell me this: {q}",
    "I'd like to know, {q}",
    "Please answer: {q}",
)


def paraphrase(question: str, template: int) -> str:
    return TEMPLATES[template % len(TEMPLATES)].format(q=question)


def draw_templates(n: int, paraphrase_p: float, rng: np.random.Generator) -> np.ndarray:
    """Each of ``n`` requests' rewrite: a template index, or -1 for the question verbatim."""
    rewrite = rng.random(n) < paraphrase_p
    template = rng.integers(0, len(TEMPLATES), size=n)
    return np.where(rewrite, template, -1)


def with_questions(trace: Trace, questions: list[str], answer_keys: list[str], *,
                   zipf_s: float = 1.0, paraphrase_p: float = 0.3, n_requests: int | None = None,
                   seed: int = 0) -> Trace:
    """``trace`` (cycled if ``n_requests`` is larger) with a question per request."""
    if len(questions) != len(answer_keys) or not questions:
        raise ValueError("questions and answer keys must be non-empty and aligned")
    n = trace.n_requests if n_requests is None else n_requests
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(len(questions))  # which question has popularity rank r
    weights = 1.0 / np.arange(1, len(questions) + 1) ** zipf_s
    picked = ranks[rng.choice(len(questions), size=n, p=weights / weights.sum())]
    template = draw_templates(n, paraphrase_p, rng)
    texts = [paraphrase(questions[j], int(t)) if t >= 0 else questions[j]
             for j, t in zip(picked, template, strict=True)]
    source = picked % trace.n_requests  # the trace request whose documents a question gets
    lengths = np.diff(trace.doc_offsets)[source]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    doc_ids = np.concatenate([trace.docs_of(int(s)) for s in source]) if n else \
        np.zeros(0, np.int64)
    base = np.arange(n) % trace.n_requests
    return Trace(
        request_id=np.arange(n, dtype=np.int64),
        arrival_s=_arrivals(trace, n),
        query_tokens=trace.query_tokens[source],
        output_tokens=trace.output_tokens[base],
        doc_offsets=offsets, doc_ids=doc_ids.astype(np.int64),
        document_ids=trace.document_ids, document_tokens=trace.document_tokens,
        query_text=pa.array(texts, pa.string()),
        answer_key=pa.array([answer_keys[j] for j in picked], pa.string()),
        document_text=trace.document_text,
        info={**trace.info, "answer_workload": {
            "questions": len(questions), "zipf_s": zipf_s, "paraphrase_p": paraphrase_p,
            "seed": seed, "templates": list(TEMPLATES)}},
    )


def _arrivals(trace: Trace, n: int) -> np.ndarray:
    """The trace's arrival times, continued at its mean gap when cycled."""
    t = trace.arrival_s.astype(float)
    if n <= len(t):
        return t[:n].copy()
    gap = (t[-1] - t[0]) / max(len(t) - 1, 1) or 1.0
    return np.concatenate([t, t[-1] + gap * np.arange(1, n - len(t) + 1)])
