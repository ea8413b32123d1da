"""The answer cache as a stage in front of retrieval, in simulated time.

Each arriving request asks the answer cache first — the *same* tier logic as the real run
(``ragsim.cache.answers``), over modelled stores: the real L1 class (cachetools, driven by the
simulated clock) and ``ModelSharedStore`` (exact-match dict and exact cosine KNN). A hit is
answered after the lookup latency of the tiers it asked and never reaches retrieval or the
engine; a miss pays the lookups and goes on; the answer is written back to every tier when the
request completes (after the answer is sent: its write costs the request nothing). The
latencies come from a profile measured on the real stores (``ragsim profile --answer-cache``,
``answer_profile``), the semantic tier's at the index's size when it is asked. Several
instances (``instances``) each have their own L1 over one shared L2/semantic tier.

What a request is, for the cache: its ``query_text`` (else its ``answer_key`` stands for the
text: a trace whose text was redacted still repeats questions exactly), its ``answer_key`` (the
ground truth: a semantic hit with another key is a *false hit*) and ``has_history`` (bypass).
Embeddings for the semantic tier are the trace's own ``query_embedding`` column when it has one
(``ragsim trace build --query-embeddings``), else the real run's embedder on ``query_text``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, Instances, ModelSharedStore
from ragsim.cache.answers.keys import exact_key, tenant_name
from ragsim.cache.answers.tiers import Embedding
from ragsim.cache.hit_rates import hit_rate_fields
from ragsim.errors import ConfigError, RagsimInputError
from ragsim.serving.answer_latency import load_answer_latency
from ragsim.serving.config import SimConfig
from ragsim.traces.schema import Trace

TIER_NAMES = ("", "l1", "l2", "semantic", "miss", "bypass")  # "": not asked (pending)
_CODE = {name: code for code, name in enumerate(TIER_NAMES)}


def core_config(config: SimConfig) -> AnswerCacheConfig:
    return AnswerCacheConfig(
        l1_size=config.answer_l1_size, l1_ttl_s=config.answer_l1_ttl_s,
        ttl_s=config.answer_ttl_s, null_ttl_s=config.answer_null_ttl_s,
        ttl_jitter=config.answer_ttl_jitter, distance_threshold=config.answer_distance,
        semantic=config.answer_semantic, guard=config.answer_guard,
        hot_top_n=config.answer_hot_top_n,
        hot_window_s=config.answer_hot_window_s, seed=config.seed)


def request_texts(trace: Trace) -> tuple[list[str], list[str], bool]:
    """(text for exact matching, answer key, whether the text is real query text)."""
    if trace.query_text is not None:
        texts = [t or "" for t in trace.query_text.to_pylist()]
        real = True
    elif trace.answer_key is not None:
        texts = [k or "" for k in trace.answer_key.to_pylist()]
        real = False
    else:
        raise RagsimInputError("the answer cache needs the trace's query_text or answer_key "
                               "(build one with ragsim trace build)", field="query_text")
    keys = [k or "" for k in trace.answer_key.to_pylist()] if trace.answer_key is not None \
        else list(texts)
    return texts, keys, real


def embed_texts(texts: list[str]) -> np.ndarray:
    """The real run's embedder (all-MiniLM-L6-v2), its vectors cached on disk."""
    from ragsim.traces.corpus.embedding import Embedder, default_cache_dir

    unique = sorted(set(texts))
    vectors = Embedder(cache_dir=default_cache_dir()).embed(unique)
    row = {t: i for i, t in enumerate(unique)}
    return vectors[[row[t] for t in texts]]


def answer_updates(texts: Sequence[str], answer_keys: Sequence[str]) -> np.ndarray:
    """Per request: whether its question (normalised) was last asked with another answer key,
    i.e. the answer changed since. The update is taken to happen when the new answer first
    appears (the latest it can have happened): stale hits are counted from then on."""
    last: dict[str, str] = {}
    updated = np.zeros(len(texts), dtype=bool)
    for i, (text, key) in enumerate(zip(texts, answer_keys, strict=True)):
        k = exact_key(text)
        previous = last.get(k)
        updated[i] = previous is not None and previous != key
        last[k] = key
    return updated


class AnswerStage:
    """Per-request decisions of the answer cache, driven by the pipeline's clock. The stores,
    the embeddings and what a lookup costs are the simulator's here; the real run's stage
    (``ragsim.realrun.answers.stage``) overrides those three and keeps the rest."""

    def __init__(self, trace: Trace, config: SimConfig, *,
                 embed: Callable[[list[str]], np.ndarray] = embed_texts) -> None:
        self.config = config
        self.texts, self.answer_keys, real_text = request_texts(trace)
        self.real_text = real_text
        n = len(self.texts)
        self.history = (np.zeros(n, dtype=bool) if trace.has_history is None
                        else np.asarray(trace.has_history, dtype=bool))
        self.stored_embeddings = trace.query_embedding  # built with them: nothing to embed
        self.semantic = config.answer_semantic and (real_text
                                                    or self.stored_embeddings is not None)
        self.embeddings = self._embeddings(embed) if self.semantic and n else None
        cache_config = core_config(config)
        if not self.semantic:
            cache_config = AnswerCacheConfig(**{**cache_config.as_dict(), "semantic": False})
        elif not real_text:  # keys stand for the text: the guard has no words to compare
            cache_config = AnswerCacheConfig(**{**cache_config.as_dict(), "guard": "none"})
        self.guard = cache_config.guard if self.semantic else "none"  # what was applied
        self.shared = self._shared_store()
        self.instances = Instances(cache_config, self.shared, config.instances,
                                   routing=config.answer_routing)
        self.tier = np.zeros(n, dtype=np.int8)
        self.false_hit = np.zeros(n, dtype=bool)
        self.distance = np.full(n, np.nan)
        self.instance = np.full(n, -1, dtype=np.int64)
        self._caches: list[AnswerCache] = list(self.instances.caches)
        self.updates = answer_updates(self.texts, self.answer_keys) \
            if config.answer_invalidate else np.zeros(n, dtype=bool)
        # each request's tenant (None: shared): with "session", its session's
        self.tenants: list[str | None] = [None] * n
        if config.answer_tenant == "session":
            if trace.session_id is None:
                raise ConfigError("answer_tenant = session needs a trace with session ids",
                                  field="answer_tenant")
            self.tenants = [None if s is None else tenant_name(s)
                            for s in trace.session_id.to_pylist()]

    # -- what the simulator models (the real stage overrides these) ------------------------
    def _embeddings(self, embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        if self.stored_embeddings is not None:
            return self.stored_embeddings
        return embed(self.texts)

    def _shared_store(self):
        self.latency = load_answer_latency(self.config.answer_profile)
        return ModelSharedStore()

    def _embedding(self, i: int) -> Embedding:
        """Request ``i``'s query vector (or a callable giving it, asked only when needed)."""
        return None if self.embeddings is None else self.embeddings[i]

    def _delay(self, tier: str, semantic_asked: bool, entries: int, elapsed_s: float) -> float:
        """The lookup's seconds: the tiers asked in turn, from the latency profile, the
        semantic tier's at the index's size (``elapsed_s``, the host's time, is not used)."""
        lat = self.latency
        if tier == "bypass":
            return 0.0
        if tier == "l1":
            return lat.l1_lookup_s
        if tier == "l2" or not semantic_asked:
            return lat.l1_lookup_s + lat.l2_lookup_s
        return lat.l1_lookup_s + lat.l2_lookup_s + lat.embed_s + lat.semantic_lookup_at(entries)

    def latency_record(self) -> dict:
        return self.latency.record()

    def close(self) -> None:
        """The run ended (the real stage stops its server)."""

    # -- the decisions ---------------------------------------------------------------------
    def lookup(self, i: int, now_s: float) -> tuple[bool, float]:
        """(answered from the cache?, lookup seconds) for request ``i`` arriving at ``now_s``."""
        cache = self.instances.route(self.texts[i])
        self.instance[i] = self._caches.index(cache)
        if self.updates[i]:  # the knowledge behind this question changed: a KB update
            cache.invalidate(self.texts[i], tenant=self.tenants[i])
        vector = self._embedding(i)
        entries = getattr(self.shared, "vector_entries", 0)  # the index as the lookup finds it
        started = time.perf_counter()
        got = cache.lookup(self.texts[i], now_s, embedding=vector,
                           history=bool(self.history[i]), tenant=self.tenants[i])
        elapsed_s = time.perf_counter() - started
        self.tier[i] = _CODE[got.tier]
        delay = self._delay(got.tier, vector is not None, entries, elapsed_s)
        if got.hit:
            self.false_hit[i] = got.entry.answer_key != self.answer_keys[i]
            if got.distance is not None:
                self.distance[i] = got.distance
        return got.hit, delay

    def write_back(self, i: int, now_s: float) -> None:
        """RAG answered request ``i``: its answer goes to every tier of its instance."""
        if TIER_NAMES[self.tier[i]] != "miss":
            return
        cache = self._caches[self.instance[i]]
        cache.write_back(self.texts[i], self.answer_keys[i], now_s, embedding=self._embedding(i),
                         answer_key=self.answer_keys[i], tenant=self.tenants[i])

    def answered(self) -> np.ndarray:
        return np.isin(self.tier, [_CODE["l1"], _CODE["l2"], _CODE["semantic"]])

    def adjust(self, cols: dict[str, np.ndarray]) -> None:
        """Requests the cache answered retrieved and prefilled nothing and decoded nothing."""
        answered = self.answered()
        cols["doc_tokens"] = np.where(answered, 0, cols["doc_tokens"])
        cols["tpot_s"] = np.where(answered, np.nan, cols["tpot_s"])
        cols["answer_tier"] = np.array(TIER_NAMES, dtype=object)[self.tier]
        cols["answer_false_hit"] = self.false_hit.copy()
        cols["answer_distance"] = self.distance.copy()

    def warnings(self) -> list[str]:
        """What the run changed of what was asked (said, so that no tier and no guard goes
        quietly: the recorded configuration still says what was asked)."""
        if self.config.answer_semantic and not self.semantic:
            return ["the answer cache's semantic tier is off: this trace holds neither its "
                    "questions' text nor their embeddings (a trace built with `ragsim trace "
                    "build --query-embeddings`, or its text, enables it)"]
        if self.semantic and self.guard != self.config.answer_guard:
            return [f"the semantic tier's false-hit guard ({self.config.answer_guard}) is off: "
                    "this trace holds its questions' embeddings but not their text, so the "
                    "guard has no words to compare and semantic hits are decided by distance "
                    "alone (a trace built with its text keeps the guard)"]
        return []

    def summary(self, cols: dict[str, np.ndarray]) -> dict:
        asked = self.tier > 0
        answered = self.answered()
        n_asked = int(asked.sum())
        hits = {name: int((self.tier == _CODE[name]).sum()) for name in ("l1", "l2", "semantic")}
        n_hits = sum(hits.values())
        engine = (cols["status"] == "completed") & ~answered & np.isfinite(cols["first_token_s"])
        doc = int(cols["doc_tokens"][engine].sum())
        gpu = int(cols["hit_tokens_gpu"][engine].sum())
        host = int(cols["hit_tokens_host"][engine].sum())
        any_hit = (cols["hit_tokens_gpu"] + cols["hit_tokens_host"])[engine] > 0
        ttft = cols["ttft_s"]
        return {
            "answer_cache_hit_rate": n_hits / n_asked if n_asked else 0.0,
            "answer_cache_hits": hits,
            "answer_cache_misses": int((self.tier == _CODE["miss"]).sum()),
            "answer_cache_bypassed": int((self.tier == _CODE["bypass"]).sum()),
            "answer_cache_false_hits": int(self.false_hit.sum()),
            # per tier: an exact tier's false hit is a stale answer (the question's answer
            # changed since it was cached), the semantic tier's a near question's answer
            "answer_cache_false_hits_by_tier": {
                name: int((self.false_hit & (self.tier == _CODE[name])).sum())
                for name in ("l1", "l2", "semantic")},
            "answer_cache_false_hit_rate": float(self.false_hit.sum()) / n_hits if n_hits
            else 0.0,
            "answer_cache_semantic": self.semantic,
            "answer_cache_guard": self.guard,  # applied; the configuration says what was asked
            "answer_cache_counters": self.instances.counters.as_dict(),
            "answer_cache_latency": self.latency_record(),
            "answer_cache_ttft_mean_s_hits": float(np.nanmean(ttft[answered]))
            if answered.any() else None,
            # the KV cache behind the answer cache: the requests that reached the engine
            "answer_cache_engine": {
                "requests": int(engine.sum()),
                **hit_rate_fields(doc, gpu, host, any_hit),
                "ttft_mean_s": float(np.nanmean(ttft[engine])) if engine.any() else None,
            },
        }
