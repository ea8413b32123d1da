"""The vector search a request goes through: how long each stage takes, what each stage returns.

A search runs on one worker of a CPU pool, in ``stages`` equal slices of ``search_s`` (IVF: a
few clusters per stage; HNSW: time slices). After each stage the index holds a current top-k;
the last stage's is the request's final list (the trace's ``doc_ids``).

Where the intermediate lists come from (``stage_source``):

* ``trace``: the trace's ``stages`` column (recorded by a real staged faiss search);
* ``synthetic``: an explicit model for traces that carry no stages. Each stage finds the
  final list with probability ``converge_p`` if no earlier stage has (geometric, seeded; the
  last stage always holds it), reflecting that approximate search often reaches its final
  top-k early (Li et al., SIGMOD 2020, the observation speculation rests on). Every earlier
  stage returns one wrong list, drawn once per request, shaped as an IVF search's lists are
  (``ragsim/traces/stage_stats.py``): the final documents found so far in their final order,
  then other documents of the corpus. D1 is found with probability ``keeps_d1_p`` (then at
  least one other final document is missing); a list without D1 holds each other final
  document with probability ``other_found_p``. Both are fitted on the first wrong lists of
  ``wiki-trivia`` (``benchmarks/fit_stage_model.py``: 0.477 and 0.777; the real lists that
  miss D1 mostly start with the final D2). Before, every wrong list kept D1, which made a
  wrong speculation share the final list's first node every time and flattered speculation.
  The default 0.72 is the maximum-likelihood fit on the real staged IVF search
  recorded in ``wiki-trivia`` (all-MiniLM-L6-v2 embeddings of Wikipedia summaries, a quarter
  of the lists probed, 4 stages: 77%, 90%, 96% of requests final after stages 1-3; the model
  gives 72%, 92%, 98%). Probing fewer lists converges later (1/16 of the lists: p = 0.54);
  ``ragsim trace stats`` fits it for any trace with stages;
* ``none``: no intermediate lists (speculation has nothing to start from);
* ``auto``: ``trace`` when the trace has stages, else ``synthetic``.

How long each stage takes (``latency``):

* ``fixed``: ``search_s`` split into equal stages (below);
* ``trace``: the trace's ``stage_times_s``, measured by ``ragsim trace build`` on a real faiss
  index, times ``time_scale`` (to stand for a larger index than the one measured: an IVF scan's
  time grows with the vectors it reads).

Either way ``handoff_s`` is added once to each search, to its first stage: the time to hand a
search to a worker and see its results, past the stages' own times (``search_handoff_s``;
``ragsim validate`` measures it on its probe runs). The front end's hand-over before that,
during which no worker is held (``search_dispatch_s``), is the pipeline's
(``Pipeline._search_dispatch``), not the search's.

Default latency, measured (``benchmarks/retrieval_latency.py``): ``search_s = 0.0155`` s, the
mean single-thread search of an IVF index at the paper's scale (300k documents, 768-d vectors,
1,024 lists) probing a quarter of its lists, the share that gave recall@2 of 0.955 against
exact search on real embeddings (wiki-trivia); a full scan took 0.062 s, 1/16 of the lists
0.0038 s (one core of this machine reads ~15 GB/s of vectors). A slower or larger index scales
it (``--search-s``); a trace built with ``ragsim trace build`` can bring its own measured times
(``latency="trace"``).
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow.compute as pc

from ragsim.errors import ConfigError
from ragsim.limits import MAX_DURATION_S
from ragsim.traces.schema import Trace


class StagedSearch:
    """Per-request stage lists and timing, precomputed compactly (no per-stage Python lists)."""

    def __init__(self, trace: Trace, final_of, *, stages: int,
                 search_s: float, source: str, seed: int, converge_p: float = 0.5,
                 keeps_d1_p: float = 1.0, other_found_p: float = 1.0,
                 latency: str = "fixed", time_scale: float = 1.0,
                 handoff_s: float = 0.0) -> None:
        if source == "auto":
            source = "trace" if trace.stages is not None else "synthetic"
        if source == "trace" and trace.stages is None:
            raise ConfigError("the trace has no 'stages' column", field="stage_source")
        self.source = source
        self._open: dict[int, list] = {}  # requests searched stage by stage now -> their lists
        self.search_s = search_s
        self._final_of = final_of  # request index -> its final top-k (a list)
        n = trace.n_requests
        if source == "trace":
            self._trace_stages = trace.stages
            lengths = pc.fill_null(pc.list_value_length(trace.stages), 0).to_numpy()
            self.stages_per_request = np.maximum(lengths.astype(np.int64), 1)
        else:
            self._trace_stages = None
            self.stages_per_request = np.full(n, stages, dtype=np.int64)
        rng = np.random.default_rng([seed, 0x5EA7C4])
        if source == "synthetic":
            # the stage (1-based) at which the final list first appears
            self._first_final = np.minimum(rng.geometric(converge_p, size=n), stages)
            self._documents = trace.document_ids
            self._seed = seed
            self._keeps_d1_p = keeps_d1_p
            self._other_found_p = other_found_p
        self.stage_s = search_s / self.stages_per_request
        # the per-request lookups of a run, as Python lists (indexing numpy per stage cost more
        # than the rest of a stage's bookkeeping)
        self._n_stages = self.stages_per_request.tolist()
        self._stage_s = self.stage_s.tolist()
        if source == "synthetic":
            self._first_final_l = self._first_final.tolist()
        self.latency = latency
        self.handoff_s = handoff_s
        if latency == "trace":
            if source != "trace" or trace.stage_times_s is None:
                raise ConfigError("the trace has no measured 'stage_times_s' (build it with "
                                  "ragsim trace build)", field="search_latency")
            times = trace.stage_times_s
            lengths = pc.fill_null(pc.list_value_length(times), 0).to_numpy().astype(np.int64)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = pc.list_flatten(times).to_numpy(zero_copy_only=False) * time_scale
            too_long = np.flatnonzero(~(flat <= MAX_DURATION_S))
            if len(too_long):  # a day-long stage is a unit mistake, and would tick for ever
                row = int(np.searchsorted(offsets, too_long[0], side="right") - 1)
                raise ConfigError(f"a measured search stage of {flat[too_long[0]]:.4g} s "
                                  f"(x search_time_scale) is longer than {MAX_DURATION_S:,.0f} s "
                                  "(30 days): are the times in seconds?", row=row,
                                  field="stage_times_s")
            running = np.concatenate([[0.0], np.cumsum(flat)])
            self._time_offsets = offsets.tolist()
            self._times = flat.tolist()
            self._total_s = (running[offsets[1:]] - running[offsets[:-1]]).tolist()

    def stage_duration_s(self, i: int, stage: int) -> float:
        """How long stage ``stage`` (1-based) of request ``i``'s search takes (the first
        stage with the hand-off: every stage's end moves by it, as a search handed to a worker
        late sees each stage late)."""
        handoff = self.handoff_s if stage == 1 else 0.0
        if self.latency == "trace":
            lo = self._time_offsets[i]
            if lo == self._time_offsets[i + 1]:
                return handoff
            return self._times[lo + stage - 1] + handoff
        return self._stage_s[i] + handoff

    def total_s(self, i: int) -> float:
        """Request ``i``'s whole search, its hand-off included."""
        if self.latency == "trace":
            return self._total_s[i] + self.handoff_s
        return self._stage_s[i] * self._n_stages[i] + self.handoff_s

    def n_stages(self, i: int) -> int:
        return self._n_stages[i]

    def stage_list(self, i: int, stage: int) -> list[int] | None:
        """Top-k after ``stage`` (1-based) of request ``i``; None when not known. (A driver
        stepping through a search asks stage by stage: the lists are drawn at its first stage
        and dropped at its last.)"""
        n = self._n_stages[i]
        if stage >= n:
            self._open.pop(i, None)
            return self._final_of(i)
        lists = self._open.get(i)
        if lists is None:
            lists = self._open[i] = self.stage_lists(i)
        return lists[stage - 1]

    def stage_lists(self, i: int) -> list[list[int] | None]:
        """The top-k after each intermediate stage of request ``i``'s search (stages 1 to
        ``n_stages(i) - 1``; the last stage's is the final list); None where not known."""
        n = self._n_stages[i]
        if n <= 1:
            return []
        if self.source == "none":
            return [None] * (n - 1)
        final = self._final_of(i)
        if self.source == "trace":
            k = len(final)
            return [found[:k] for found in self._trace_stages[i].as_py()[:n - 1]]
        first_final = min(self._first_final_l[i], n)
        if first_final <= 1 or not final:
            return [final] * (n - 1)
        wrong = self._draw_wrong(i, final)
        return [wrong] * (first_final - 1) + [final] * (n - first_final)

    def _draw_wrong(self, i: int, final: list) -> list:
        """Request ``i``'s wrong list (see the module's docstring), from its own seeded stream
        so that it does not depend on which other requests drew one."""
        # Python's generator: seeding it costs a third of numpy's, and a wrong list needs a
        # few draws (random() only: its sequence for an int seed is stable across versions)
        draw = random.Random((self._seed << 64) ^ (0x5EA7C4 << 32) ^ i).random
        k = len(final)
        if draw() < self._keeps_d1_p:
            found = [True] + [draw() < self._other_found_p for _ in range(k - 1)]
            if all(found):
                found[1 + int(draw() * (k - 1)) if k > 1 else 0] = False
        else:
            found = [False] + [draw() < self._other_found_p for _ in range(k - 1)]
        kept = [d for d, f in zip(final, found, strict=True) if f]
        documents = self._documents
        n_documents = len(documents)
        others: list = []
        for _ in range(8 * k):  # other documents of the corpus; tiny corpora may run out
            if len(kept) + len(others) == k:
                break
            other = int(documents[int(draw() * n_documents)])
            if other not in final and other not in others:
                others.append(other)
        wrong = kept + others
        return wrong if len(wrong) == k else list(final)  # tiny corpora: no wrong list
