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
are Poisson at ``rate_rps``.

Popularity drifts: after every 1,000 requests, ``drift_per_1k_requests`` of the popularity ranks
trade documents (topics rise and fall while the law stays the same). The built-in traces use
0.51, measured on real RAG traffic, not fitted to any result: ``python
benchmarks/measure_drift.py`` measures the top-10 turnover of leading documents between windows
of 1,000 requests (``stats.popularity_drift``, corrected for sampling noise with the same trace
shuffled) and finds the drift at which generated traces of the same length and skew show the
same turnover (``drift.fit_drift``). On ``ragpulse`` (a university Q&A RAG service, its
requests in recorded order, measured on their passages) the corrected turnover is 0.48 per
1,000 requests and the fit 0.51 (four window pairs: give or take about 0.1). Mooncake's
conversation trace (real chat traffic) is too flat for the statistic to resolve below ~0.45;
the previous default, 0.78, came from a proxy (``wiki-trivia-topics``: trivia questions in
their file's topical order). Per hour of their own clocks the real traces disagree by orders of
magnitude (RAGPulse 0.01, 2.5 days per 1,000 requests): the knob counts requests, and
docs/workloads.md gives the caveats. ``drift_per_1k_requests=0`` (``trace generate --drift
0``) gives stationary popularity, LFU's best case.

Two side effects of drifting a rank-to-document map. The skew target holds for the whole trace,
so the popularity of any one moment is steeper than without drift (100,000 ``mmlu`` requests:
Zipf exponent 1.22 at the default, 1.30 at 0.78, 1.06 at 0.1, 0.92 without drift). And
neighbours are drawn in rank space, so a document's co-retrieved neighbours change when its
rank does: pairs recur less than the fit on real retrieval says (``stats.co_retrieval``,
10,000 ``nq`` requests: 12%, 30%, 26% against 15%, 38%, 31% without drift). A drift that moved
whole neighbourhoods (topics) would keep the pairs.

The corpus is fixed: 30,000 documents (``n_documents``) whatever the number of requests. A
knowledge base does not grow with the traffic that queries it, so a longer trace is a longer
period of the same service: it revisits the same documents more, and its hit rates are higher
(``ragsim replay --trace mmlu --requests N``: 56.0% of document tokens at 10,000 requests,
61.9% at 100,000).
Scaling the corpus with the request count would keep hit rates level but make every length a
different knowledge base; instead the run summary notes a synthetic trace longer than the
10,000 requests the corpus was sized with (``ragsim.serving.notices``), so that runs of different
lengths are not compared as if they were one workload.

Documents are co-retrieved as in real retrieval: similar passages come together, so the same
ordered pair [D1, D2] recurs (what a prefix tree caches). With probability ``co_retrieval_p`` a
list's next document is one of the previous document's ``neighbours`` (a fixed list per
document, drawn from the popularity law, so popular passages neighbour popular ones), otherwise
an independent popularity draw. The defaults (0.9, 8 neighbours, all alike) are the least-squares
fit, at wiki-trivia's skew and size, of three statistics of the real staged retrieval recorded in
``wiki-trivia`` (``stats.co_retrieval``): pair repeats 17% (real 20%), pair repeats among
requests whose first document was seen 38% (37%), favourite second document's share 31% (31%);
independent draws give 1%, 2% and 15%. ``co_retrieval_p=0`` reproduces the independent model
(and earlier traces) exactly. Every parameter is printed by ``ragsim trace stats`` and stored
in the trace's info.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import asdict, dataclass, replace

import numpy as np

from ragsim.errors import TraceError
from ragsim.limits import TRACE_BYTES_PER_REQUEST, memory_problem
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
    # co-retrieval, fitted on real retrieval (wiki-trivia; benchmarks/calibrate_synthetic.py):
    # a list's next document is, with this chance, one of the previous one's neighbours
    co_retrieval_p: float = 0.9
    neighbours: int = 8  # neighbours per document (drawn from the popularity law)
    neighbour_decay: float = 1.0  # weight of the i-th neighbour: decay**i (1: all alike)
    seed: int = 0


# measured on RAGPulse, real RAG traffic, by benchmarks/measure_drift.py (module docstring)
BUILTIN_DRIFT_PER_1K_REQUESTS = 0.51

BUILTIN_SPECS: dict[str, SyntheticSpec] = {
    "mmlu": SyntheticSpec("mmlu", target_top3_share=0.60,
                          drift_per_1k_requests=BUILTIN_DRIFT_PER_1K_REQUESTS),
    "nq": SyntheticSpec("nq", target_top3_share=0.30, query_tokens_median=12.0,
                        query_tokens_sigma=0.35, output_tokens_median=12.0,
                        drift_per_1k_requests=BUILTIN_DRIFT_PER_1K_REQUESTS),
}


def _lognormal_ints(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int,
                    hi: int) -> np.ndarray:
    values = rng.lognormal(np.log(median), sigma, size=n)
    return np.clip(np.rint(values), lo, hi).astype(np.int64)


@dataclass(frozen=True)
class Neighbours:
    """Co-retrieval: after document at rank r, the next one is, with probability ``follow_p``,
    one of r's neighbours (row r, picked with cumulative weights ``pick_cdf``).

    A neighbour is stored as its popularity draw (a uniform) and mapped to a rank through the
    popularity CDF only when a list follows it: the exponent search regenerates lists ~35
    times, and mapping all n_documents x M neighbours each time cost 3-4x the whole trace.
    """

    draws: np.ndarray  # float64 (n_documents, M): each neighbour's popularity uniform
    pick_cdf: np.ndarray  # float64 (M,)
    follow_p: float
    follow_u: np.ndarray  # (n_requests, top_k) uniforms: follow a neighbour?
    pick_u: np.ndarray  # (n_requests, top_k) uniforms: which one


def _sample_lists(uniforms: np.ndarray, cdf: np.ndarray, top_k: int,
                  rng: np.random.Generator, neighbours: Neighbours | None = None) -> np.ndarray:
    """Rank-ordered lists of ``top_k`` distinct popularity ranks, one row per request.

    Each position takes, in order of preference: a neighbour of the previous position's rank
    (when co-retrieval is on and its coin says so), then the request's popularity draws in
    order; anything already in the list is skipped.
    """
    cand = np.minimum(np.searchsorted(cdf, uniforms, side="right"), len(cdf) - 1)
    n = cand.shape[0]
    out = np.full((n, top_k), -1, dtype=np.int64)
    for j in range(top_k):
        missing = np.ones(n, dtype=bool)
        if neighbours is not None and j > 0:
            follow = neighbours.follow_u[:, j] < neighbours.follow_p
            which = np.minimum(np.searchsorted(neighbours.pick_cdf, neighbours.pick_u[:, j],
                                               side="right"), neighbours.draws.shape[1] - 1)
            draw = neighbours.draws[np.maximum(out[:, j - 1], 0), which]
            choice = np.minimum(np.searchsorted(cdf, draw, side="right"), len(cdf) - 1)
            ok = follow & ~(out[:, :j] == choice[:, None]).any(axis=1)
            out[ok, j] = choice[ok]
            missing &= ~ok
        for c in range(cand.shape[1]):
            if not missing.any():
                break
            col = cand[:, c]
            ok = missing & ~(out[:, :j] == col[:, None]).any(axis=1)
            out[ok, j] = col[ok]
            missing &= ~ok
        for r in np.flatnonzero(missing):  # rare: too many repeats among the candidates
            chosen = set(out[r, :j].tolist())
            while True:
                x = int(min(np.searchsorted(cdf, rng.random(), side="right"), len(cdf) - 1))
                if x not in chosen:
                    out[r, j] = x
                    break
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
    if not 0.0 <= spec.co_retrieval_p <= 1.0:
        raise ValueError("co_retrieval_p must lie in [0, 1]")
    if spec.neighbours < 1 or not 0.0 < spec.neighbour_decay <= 1.0:
        raise ValueError("neighbours must be >= 1 and neighbour_decay in (0, 1]")
    rng = np.random.default_rng(spec.seed)
    uniforms = rng.random((spec.n_requests, 3 * spec.top_k))
    drifting = spec.drift_per_1k_requests > 0
    # co-retrieval draws its own random numbers, so traces without it are unchanged
    nb_rng = np.random.default_rng([spec.seed, 0xC0DE])
    nb_u = nb_rng.random((spec.n_documents, spec.neighbours))
    follow_u = nb_rng.random((spec.n_requests, spec.top_k))
    pick_u = nb_rng.random((spec.n_requests, spec.top_k))
    pick_w = spec.neighbour_decay ** np.arange(spec.neighbours, dtype=np.float64)
    pick_cdf = np.cumsum(pick_w) / pick_w.sum()

    def share(exponent: float, rows: int) -> tuple[float, np.ndarray]:
        cdf = _zipf_cdf(spec.n_documents, exponent)
        neighbours = None
        if spec.co_retrieval_p > 0:
            # neighbours follow the popularity law: popular passages sit near popular ones
            neighbours = Neighbours(draws=nb_u, pick_cdf=pick_cdf,
                                    follow_p=spec.co_retrieval_p, follow_u=follow_u[:rows],
                                    pick_u=pick_u[:rows])
        lists = _sample_lists(uniforms[:rows], cdf, spec.top_k,
                              np.random.default_rng(spec.seed + 1), neighbours)
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
        problem = memory_problem(n_requests, TRACE_BYTES_PER_REQUEST)
        if problem:  # before minutes of generating end in a MemoryError
            raise TraceError(f"cannot be generated here: {problem}", field="--requests")
        changes["n_requests"] = n_requests
    generated = _generated(replace(spec, **changes))
    return replace(generated, info=copy.deepcopy(generated.info))  # its own info, shared arrays


@functools.lru_cache(maxsize=4)
def _generated(spec: SyntheticSpec) -> Trace:
    """A generated trace, kept for the next run of this process that asks for the same one.

    Calibrating the popularity law regenerates the lists ~35 times: for 10,000 requests that
    took about a quarter of a whole simulation at moderate load, and a sweep runs dozens of
    points (systems, rates, profiles) on each trace. Its arrays are made read-only, so that no
    run can change what the next one gets."""
    trace = generate(spec)
    for value in vars(trace).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    return trace
