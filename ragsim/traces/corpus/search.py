"""Staged vector search with faiss, timed: what speculative pipelining sees of a real index.

RAGCache starts generation on the top-k an approximate search holds part-way through and checks
it when the search ends; whether that pays depends on how early the top-k settles, which only a
real index shows. Two index kinds, both over L2-normalised vectors with inner product:

* **IVF** (``nlist`` lists, ``nprobe`` probed): the query's nearest ``nprobe`` lists, in order of
  centroid similarity, are scanned ``nprobe / stages`` at a time; after each stage the running
  top-k (merged with the previous stages') is recorded. Each stage scans only its own lists, so
  stage times add up to one search and the last stage's top-k is exactly faiss's own
  ``search`` with that ``nprobe`` (tested).
* **HNSW** (``M``, ``efSearch``): a graph search cannot be paused inside faiss, so stage ``s``
  is the search with ``efSearch * s / stages``; its recorded time is how much longer that search
  took than the previous stage's (the time a resumable search would have spent on the stage).

Times are wall-clock measurements of one query on one thread (faiss's OpenMP pool set to 1), as
one worker of the serving system's search pool would run it; they are measurements, so they
differ between builds, unlike every other column of a trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.traces.corpus.threads import one_thread

INDEX_KINDS = ("ivf", "hnsw")


@dataclass(frozen=True)
class IndexSpec:
    kind: str = "ivf"
    nlist: int | None = None  # None: 4 * sqrt(documents), at most documents / 39,
    # at least `stages`
    nprobe: int | None = None  # IVF lists probed; None: nlist / 16, at least `stages`
    hnsw_m: int = 32
    ef_construction: int = 64
    ef_search: int = 64
    stages: int = 4

    def resolved(self, n_documents: int) -> IndexSpec:
        """Defaults filled in for a corpus size (faiss wants >= 39 training points per list)."""
        if self.kind not in INDEX_KINDS:
            raise RagsimInputError(f"unknown index {self.kind!r}; choose one of "
                                   f"{', '.join(INDEX_KINDS)}", field="--index")
        if self.stages < 1:
            raise RagsimInputError("must be >= 1", field="--stages")
        if self.kind == "hnsw":
            for name in ("hnsw_m", "ef_construction", "ef_search"):
                if getattr(self, name) < 1:
                    raise RagsimInputError("must be >= 1", field="--" + name.replace("_", "-"))
            return self
        nlist = self.nlist
        if nlist is None:
            nlist = max(1, min(round(4 * math.sqrt(n_documents)), n_documents // 39))
            # a small corpus still gets one list per stage (faiss then warns about few
            # training points per list; staging needs the lists)
            nlist = max(nlist, min(self.stages, n_documents))
        if not 1 <= nlist <= n_documents:
            raise RagsimInputError(f"must lie in [1, documents={n_documents}]", field="--nlist")
        nprobe = self.nprobe if self.nprobe is not None else min(nlist,
                                                                 max(self.stages, nlist // 16))
        if not 1 <= nprobe <= nlist:
            raise RagsimInputError(f"must lie in [1, nlist={nlist}]", field="--nprobe")
        if self.stages > nprobe:
            raise RagsimInputError(f"IVF stages scan whole lists: at most nprobe={nprobe} "
                                   "stages", field="--stages")
        return IndexSpec(kind="ivf", nlist=nlist, nprobe=nprobe, hnsw_m=self.hnsw_m,
                         ef_construction=self.ef_construction, ef_search=self.ef_search,
                         stages=self.stages)

    def describe(self) -> dict:
        keep = ("kind", "nlist", "nprobe", "stages") if self.kind == "ivf" else (
            "kind", "hnsw_m", "ef_construction", "ef_search", "stages")
        return {k: v for k, v in asdict(self).items() if k in keep}


@dataclass
class StagedResult:
    """Per query: the final top-k, the top-k after each stage, and each stage's time."""

    final_ids: np.ndarray  # int64 (n, k); -1 where the index found fewer than k
    stage_ids: np.ndarray  # int64 (n, stages, k)
    stage_times_s: np.ndarray  # float64 (n, stages)
    build_s: float


class StagedIndex:
    def __init__(self, vectors: np.ndarray, spec: IndexSpec, *, seed: int,
                 kmeans_iterations: int | None = None) -> None:
        """``kmeans_iterations``: IVF training iterations (None: faiss's default); fewer make a
        timing-only index faster to build, since list quality does not change a scan's time."""
        import faiss

        self._faiss = faiss
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.spec = spec.resolved(len(vectors))
        dim = vectors.shape[1]
        started = time.perf_counter()
        if self.spec.kind == "ivf":
            self.quantizer = faiss.IndexFlatIP(dim)
            self.index = faiss.IndexIVFFlat(self.quantizer, dim, self.spec.nlist,
                                            faiss.METRIC_INNER_PRODUCT)
            self.index.cp.seed = seed  # k-means initialisation: same seed, same lists
            if kmeans_iterations is not None:
                self.index.cp.niter = kmeans_iterations
            self.index.train(vectors)
            self.index.add(vectors)
            self.index.nprobe = self.spec.nprobe
        else:
            self.index = faiss.IndexHNSWFlat(dim, self.spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            self.index.hnsw.efConstruction = self.spec.ef_construction
            # graph construction with several threads depends on their interleaving
            with single_thread(faiss):
                self.index.add(vectors)
        self.build_s = time.perf_counter() - started

    def search(self, queries: np.ndarray, top_k: int,
               progress: Callable[[int], None] | None = None) -> StagedResult:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n, stages = len(queries), self.spec.stages
        stage_ids = np.full((n, stages, top_k), -1, dtype=np.int64)
        stage_times = np.zeros((n, stages), dtype=np.float64)
        with single_thread(self._faiss):
            for q in range(n):
                for s, (ids, seconds) in enumerate(self.stages(queries[q:q + 1], top_k)):
                    stage_ids[q, s, : len(ids)] = ids
                    stage_times[q, s] = seconds
                if progress is not None:
                    progress(1)
        return StagedResult(final_ids=stage_ids[:, -1, :].copy(), stage_ids=stage_ids,
                            stage_times_s=stage_times, build_s=self.build_s)

    def stages(self, query: np.ndarray, top_k: int) -> Iterator[tuple[np.ndarray, float]]:
        """One query's search, a stage per step: yields (the top-k so far, the stage's seconds).

        Each step runs when asked, so a serving system's worker can run a stage, hand its list
        on, and go on with the next. Search parameters are passed per call and the index is
        never changed, so several workers may search one index at once (faiss releases the
        GIL while it searches)."""
        query = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        if self.spec.kind == "ivf":
            return self._ivf_stages(query, top_k)
        return self._hnsw_stages(query, top_k)

    def _ivf_stages(self, query: np.ndarray, top_k: int) -> Iterator[tuple[np.ndarray, float]]:
        spec = self.spec
        clock = time.perf_counter
        t0 = clock()
        list_sims, lists = self.quantizer.search(query, spec.nprobe)
        assign_s = clock() - t0
        bounds = np.linspace(0, spec.nprobe, spec.stages + 1).round().astype(int)
        best_sims = np.empty(0, dtype=np.float32)
        best_ids = np.empty(0, dtype=np.int64)
        for s in range(spec.stages):
            lo, hi = bounds[s], bounds[s + 1]
            t0 = clock()
            sims, ids = self._scan_lists(query, top_k, lists[:, lo:hi], list_sims[:, lo:hi])
            best_sims, best_ids = merge_top_k(best_sims, best_ids, sims[0], ids[0], top_k)
            yield best_ids.copy(), clock() - t0 + (assign_s if s == 0 else 0.0)

    def _scan_lists(self, query: np.ndarray, top_k: int, lists: np.ndarray,
                    list_sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scan the given IVF lists only. faiss's Python ``search_preassigned`` takes the list
        count from the index's ``nprobe`` (shared state: two workers would race on it) and
        refuses per-call parameters, so its C entry point is called with them."""
        faiss = self._faiss
        lists = np.ascontiguousarray(lists, dtype=np.int64)
        list_sims = np.ascontiguousarray(list_sims, dtype=np.float32)
        sims = np.empty((1, top_k), dtype=np.float32)
        ids = np.empty((1, top_k), dtype=np.int64)
        params = faiss.SearchParametersIVF(nprobe=int(lists.shape[1]))
        self.index.search_preassigned_c(1, faiss.swig_ptr(query), top_k, faiss.swig_ptr(lists),
                                        faiss.swig_ptr(list_sims), faiss.swig_ptr(sims),
                                        faiss.swig_ptr(ids), False, params)
        return sims, ids

    def _hnsw_stages(self, query: np.ndarray, top_k: int
                     ) -> Iterator[tuple[np.ndarray, float]]:
        spec = self.spec
        clock = time.perf_counter
        previous_s = 0.0
        for s in range(spec.stages):
            ef = max(top_k, math.ceil(spec.ef_search * (s + 1) / spec.stages))
            params = self._faiss.SearchParametersHNSW(efSearch=ef)
            t0 = clock()
            _, ids = self.index.search(query, top_k, params=params)
            took = clock() - t0
            yield ids[0].copy(), max(0.0, took - previous_s)
            previous_s = max(previous_s, took)


def merge_top_k(sims_a: np.ndarray, ids_a: np.ndarray, sims_b: np.ndarray, ids_b: np.ndarray,
                top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``top_k`` of two result lists by similarity (ties: smaller id first, as a
    deterministic rule); faiss marks missing results with id -1."""
    sims = np.concatenate([sims_a, sims_b])
    ids = np.concatenate([ids_a, ids_b])
    valid = ids >= 0
    sims, ids = sims[valid], ids[valid]
    order = np.lexsort((ids, -sims))[:top_k]
    return sims[order], ids[order]


def exact_top_k(vectors: np.ndarray, queries: np.ndarray, top_k: int) -> np.ndarray:
    """Exhaustive inner-product search: the truth recall is measured against."""
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    _, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), top_k)
    return ids


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of the exact top-k that the search found (order ignored; -1 is no result)."""
    if found.size == 0:
        return 1.0
    valid_truth = truth >= 0
    matched = ((truth[:, None, :] == found[:, :, None]) & (found >= 0)[:, :, None]).any(axis=1)
    per_query = (matched & valid_truth).sum(axis=1) / np.maximum(valid_truth.sum(axis=1), 1)
    return float(per_query.mean())


def single_thread(faiss):
    """faiss's OpenMP pool at one thread inside the block (restored after)."""
    return one_thread(faiss.omp_get_max_threads, faiss.omp_set_num_threads)
