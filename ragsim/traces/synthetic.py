"""Seeded synthetic RAG traces calibrated to the paper's retrieval skew: ``mmlu`` and ``nq``.

These are *synthetic*: no MMLU or Natural Questions data is read. Document popularity follows a
Zipf law over a shuffled catalogue, with the exponent found by bisection so that the generated
trace has the target retrieval skew (share of retrievals taken by the top 3% of retrieved
documents): 60% for ``mmlu`` (RAGCache, section 3: "in MMLU, 3% of documents receive 60% of
retrievals") and a flatter 30% for ``nq`` (the paper's Figure 5 shows NQ as less skewed; the
exact number is our reading, not the paper's). Each request retrieves ``top_k`` distinct documents
in rank order, more popular documents tending to rank first. Sizes are log-normal: documents of a
few hundred to a few thousand tokens (Wikipedia passages; the paper's Figure 3), MMLU questions
with their four choices (~80 tokens) and short answers, NQ's short search-like questions. Arrivals
are Poisson at ``rate_rps``. Popularity is stationary unless ``drift_per_1k_requests`` is set:
then, after every 1,000 requests, that fraction of the popularity ranks trade documents (topics
rise and fall; a stationary Zipf law is the best case of LFU, real traffic is not). Every
parameter is printed by ``ragsim trace stats`` and stored in the
trace's info.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from ragsim.traces.schema import Trace
from ragsim.traces.stats import retrieval_skew


@dataclass(frozen=True)
class SyntheticSpec:
    name: str
    n_requests: int = 10_000
    n_documents: int = 30_000
    top_k: int = 2
    target_top3_share: float = 0.60
    doc_tokens_median: float = 700.0
    doc_tokens_sigma: float = 0.55
    doc_tokens_min: int = 64
    doc_tokens_max: int = 4096
    query_tokens_median: float = 80.0
    query_tokens_sigma: float = 0.4
    output_tokens_median: float = 32.0
    output_tokens_sigma: float = 0.6
    rate_rps: float = 1.0
    drift_per_1k_requests: float = 0.0
    seed: int = 0


BUILTIN_SPECS: dict[str, SyntheticSpec] = {
    "mmlu": SyntheticSpec("mmlu", target_top3_share=0.60),
    "nq": SyntheticSpec("nq", target_top3_share=0.30, query_tokens_median=12.0,
                        query_tokens_sigma=0.35, output_tokens_median=12.0),
}


def _lognormal_ints(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int,
                    hi: int) -> np.ndarray:
    values = rng.lognormal(np.log(median), sigma, size=n)
    return np.clip(np.rint(values), lo, hi).astype(np.int64)


def _sample_lists(uniforms: np.ndarray, cdf: np.ndarray, top_k: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Rank-ordered lists of ``top_k`` distinct popularity ranks, one row per request."""
    cand = np.minimum(np.searchsorted(cdf, uniforms, side="right"), len(cdf) - 1)
    n = cand.shape[0]
    out = np.full((n, top_k), -1, dtype=np.int64)
    filled = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    for c in range(cand.shape[1]):
        col = cand[:, c]
        fresh = filled < top_k
        for j in range(top_k):
            fresh &= out[:, j] != col
        out[rows[fresh], filled[fresh]] = col[fresh]
        filled += fresh
    for r in np.flatnonzero(filled < top_k):  # rare: too many repeats among the candidates
        chosen = list(out[r, : filled[r]])
        while len(chosen) < top_k:
            x = int(min(np.searchsorted(cdf, rng.random(), side="right"), len(cdf) - 1))
            if x not in chosen:
                chosen.append(x)
        out[r] = chosen
    return out


def _zipf_cdf(n: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


DRIFT_BLOCK_REQUESTS = 1000


def _drifting_ranks_to_docs(rank_lists: np.ndarray, n_documents: int, drift: float,
                            seed: int) -> np.ndarray:
    """Map popularity ranks to documents with a mapping that drifts: after every block of
    1,000 requests, ``drift`` of the ranks (chosen at random) trade documents among themselves,
    so topics rise and fall while the popularity law stays the same."""
    rng = np.random.default_rng(seed)
    mapping = rng.permutation(n_documents).astype(np.int64)
    moved = round(drift * n_documents)
    out = np.empty_like(rank_lists)
    for start in range(0, len(rank_lists), DRIFT_BLOCK_REQUESTS):
        stop = start + DRIFT_BLOCK_REQUESTS
        out[start:stop] = mapping[rank_lists[start:stop]]
        if moved > 1:
            ranks = rng.choice(n_documents, size=moved, replace=False)
            mapping[ranks] = mapping[rng.permutation(ranks)]
    return out


def generate(spec: SyntheticSpec) -> Trace:
    if spec.top_k > spec.n_documents:
        raise ValueError("top_k cannot exceed the number of documents")
    if not 0.0 <= spec.drift_per_1k_requests <= 1.0:
        raise ValueError("drift_per_1k_requests must lie in [0, 1]")
    rng = np.random.default_rng(spec.seed)
    uniforms = rng.random((spec.n_requests, 3 * spec.top_k))
    drifting = spec.drift_per_1k_requests > 0

    def share(exponent: float, rows: int) -> tuple[float, np.ndarray]:
        lists = _sample_lists(uniforms[:rows], _zipf_cdf(spec.n_documents, exponent),
                              spec.top_k, np.random.default_rng(spec.seed + 1))
        if drifting:  # skew is measured on documents, which drift spreads out
            lists = _drifting_ranks_to_docs(lists, spec.n_documents,
                                            spec.drift_per_1k_requests, spec.seed + 2)
        return retrieval_skew(lists.ravel())["top_3pct_share"], lists

    def bisect(lo: float, hi: float, rows: int, steps: int) -> float:
        # common random numbers make the share monotone in the exponent
        for _ in range(steps):
            mid = (lo + hi) / 2
            if share(mid, rows)[0] < spec.target_top3_share:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    # coarse on a prefix of the requests, then fine on all of them (the skew of "the top 3% of
    # retrieved documents" depends on how many requests there are)
    rough = bisect(0.0, 3.0, min(spec.n_requests, 20_000), 24)
    exponent = bisect(max(0.0, rough - 0.15), rough + 0.15, spec.n_requests, 10)
    achieved, lists = share(exponent, spec.n_requests)
    permutation = rng.permutation(spec.n_documents).astype(np.int64)  # rank -> doc id
    doc_lists = lists if drifting else permutation[lists]
    doc_tokens = _lognormal_ints(rng, spec.n_documents, spec.doc_tokens_median,
                                 spec.doc_tokens_sigma, spec.doc_tokens_min, spec.doc_tokens_max)
    query_tokens = _lognormal_ints(rng, spec.n_requests, spec.query_tokens_median,
                                   spec.query_tokens_sigma, 1, 4096)
    output_tokens = _lognormal_ints(rng, spec.n_requests, spec.output_tokens_median,
                                    spec.output_tokens_sigma, 1, 4096)
    gaps = rng.exponential(1.0 / spec.rate_rps, size=spec.n_requests)
    gaps[0] = 0.0
    arrival_s = np.cumsum(gaps)
    return Trace(
        request_id=np.arange(spec.n_requests, dtype=np.int64),
        arrival_s=arrival_s,
        query_tokens=query_tokens,
        output_tokens=output_tokens,
        doc_offsets=np.arange(0, spec.n_requests * spec.top_k + 1, spec.top_k, dtype=np.int64),
        doc_ids=doc_lists.ravel(),
        document_ids=np.arange(spec.n_documents, dtype=np.int64),
        document_tokens=doc_tokens,
        info={
            "source": "synthetic",
            "generator": spec.name,
            "calibrated": True,
            "parameters": asdict(spec),
            "zipf_exponent": round(exponent, 6),
            "achieved_top3_share": round(achieved, 6),
        },
    )


def builtin_trace(name: str, *, seed: int = 0, n_requests: int | None = None,
                  **overrides) -> Trace:
    spec = BUILTIN_SPECS[name]
    changes = {"seed": seed, **overrides}
    if n_requests is not None:
        changes["n_requests"] = n_requests
    return generate(replace(spec, **changes))
