"""The answer cache in a real run (``ragsim run --backend torch --answer-cache``): the same
stage as the simulator's, the same tier logic, on the REAL stores and the run's wall clock.

L1 is cachetools (as in the simulator, driven by the run's clock), L2 and the semantic tier a
real Redis: the user's (``answer_redis_url``) or an embedded server started for the run and
stopped when it ends. On the user's server the run keeps to a namespace of its own
(``answer_namespace``, else a fresh run id, whose keys are deleted when the run ends); it never
reads or deletes another key. A lookup costs what it took: the call is made on
the run's loop and its measured seconds are the request's delay (the clock has already moved
by them). The real embedder embeds the query text at the lookup, only when the semantic tier
is asked (the vector is kept for the write-back); when the trace stores its vectors, the stored
one makes the decision (so the simulator, which reads the same vectors, decides alike) and the
time is still the real embedding's. A trace with vectors and no text embeds nothing. Store
failures fail open, as everywhere (``StoreError``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ragsim.cache.answers.tiers import Embedding
from ragsim.serving.answer_stage import AnswerStage, embed_texts
from ragsim.serving.config import SimConfig
from ragsim.traces.schema import Trace


class RealAnswerStage(AnswerStage):
    """``AnswerStage`` over cachetools + Redis + redisvl, timed by the wall clock."""

    def __init__(self, trace: Trace, config: SimConfig, *,
                 embed: Callable[[list[str]], np.ndarray] = embed_texts) -> None:
        self._server = None
        self._store = None
        self._keys_at_start = 0
        self._embedder = None
        self._vectors: dict[int, np.ndarray] = {}
        try:
            super().__init__(trace, config, embed=embed)
        except BaseException:
            self.close()
            raise

    def _embeddings(self, embed):
        """Texts are embedded at their lookup (the real cost); a trace's stored vectors, when
        it has them, make the decisions (the simulator's, on the same trace)."""
        if self.real_text:
            from ragsim.traces.corpus.embedding import Embedder

            self._embedder = Embedder()
            self._embedder.embed(["warm up before the clock starts"])
        return self.stored_embeddings

    def _dims(self) -> int:
        if self.stored_embeddings is not None:
            return int(self.stored_embeddings.shape[1])
        return self._embedder.dimension if self._embedder is not None else 2

    def _shared_store(self):
        from ragsim.realrun.answers.golden import check_server, describe_user_server
        from ragsim.realrun.answers.server import EmbeddedServer
        from ragsim.realrun.answers.stores import RedisSharedStore, VectorIndex

        url = self.config.answer_redis_url
        if url:
            check_server(url, field="--redis-url")
            self.server_description = describe_user_server(url)
        else:
            self._server = EmbeddedServer().start()
            url = self._server.url
            self.server_description = self._server.description
        store = RedisSharedStore(url, dims=self._dims(),
                                 distance_threshold=self.config.answer_distance,
                                 index=VectorIndex(), embed=None,
                                 namespace=self.config.answer_namespace)
        # a fresh namespace is empty: the run starts cold, as the simulated one does; a named
        # one may hold an earlier run's entries (a warm start, on purpose): counted here
        self._keys_at_start = len(store.own_keys())
        self._store = store
        return store

    def _embedding(self, i: int) -> Embedding:
        if not self.semantic:
            return None
        if self._embedder is None:  # vectors and no text: nothing to embed
            return self.embeddings[i]

        def vector() -> np.ndarray:
            if i not in self._vectors:
                embedded = self._embedder.embed([self.texts[i]])[0]  # timed with the lookup
                self._vectors[i] = embedded if self.embeddings is None else self.embeddings[i]
            return self._vectors[i]

        return vector

    def _delay(self, tier: str, semantic_asked: bool, entries: int, elapsed_s: float) -> float:
        return elapsed_s

    def latency_record(self) -> dict:
        return {"source": "measured: each lookup's own wall time on the real stores",
                "server": self.server_description}

    def summary(self, cols: dict[str, np.ndarray]) -> dict:
        out = super().summary(cols)
        out["answer_cache_server"] = {"server": self.server_description,
                                      "namespace": self.shared.namespace,
                                      "namespace_keys_at_start": self._keys_at_start,
                                      **self.shared.server_stats()}
        return out

    def lookup(self, i: int, now_s: float) -> tuple[bool, float]:
        answered, delay = super().lookup(i, now_s)
        if answered:  # no write-back to come
            self._vectors.pop(i, None)
        return answered, delay

    def write_back(self, i: int, now_s: float) -> None:
        super().write_back(i, now_s)
        self._vectors.pop(i, None)

    def close(self) -> None:
        if self._store is not None:  # this run's own namespace goes with it
            self._store.release()
            self._store = None
        if self._server is not None:
            self._server.stop()
            self._server = None


def real_answer_stage(trace: Trace, config: SimConfig) -> RealAnswerStage:
    """The pipeline's ``answers`` factory for a real run."""
    return RealAnswerStage(trace, config)
