"""The engine's iterations run for real: a forward pass on a ``TorchModel`` per iteration.

This is ``ragsim.serving.engine.Iterations`` for the real harness. The serving engine decides
(admission, batching, memory, terminations, faults) exactly as in the simulator; this object
does what it decided and reports how long it took:

* **The KV cache is the knowledge tree's.** The tree records its residency moves
  (``KnowledgeTree(record_moves=True)``); before every iteration they are carried out on the
  ``KVStore`` (swap-outs copy to the host pool, swap-ins copy back, evictions and drops free).
  A node the tree admitted for a request is computed by that request's prefill and stored under
  the node right after it (until then it is *pending*: a move that touches it waits).
* **Prefill** computes only what the engine did not reuse: a job's row is its context (system
  prompt, documents, query) after ``job.alpha`` tokens, on top of the stored KV of its cached
  prefix (the root's, then its hit nodes', cut to ``alpha``: a block-granular engine reuses whole
  blocks only). The batch's rows share one left-padded pass. Where the engine lets a request
  use KV a batch mate is computing (``batch_kv_sharing``), that request's row waits for a second
  pass in the same iteration: the tree counts the KV as reused, and a real engine must compute it
  first.
* **Position-free reuse** (``--reuse blend:R|epic:K``; the tree's ``AccessResult.free_nodes``):
  a job whose documents after its exact prefix were found elsewhere in the store gets its own
  blended prefill (``ragsim.realrun.blend.prefill_request``): the exact prefix's stored KV, each
  such document's KV read from the node that holds it (GPU, or the host copy where it lies),
  moved from the position it was computed at (recorded when a node is stored) to its place in
  this context, and the rule's count of its tokens recomputed over the assembled context
  (``ReuseRule.recompute_tokens``, the core's count). The blended KV of the job's own new path
  nodes is stored under them, as the tree admitted them computed. What the engine reused and
  recomputed is counted from the blended prefill itself (``engine_position_free_hit_tokens``,
  ``engine_blend_recomputed_tokens``), beside the core's ``position_free_hit_tokens`` and
  ``blend_recomputed_tokens``.
* **Decode** generates one greedy token for every running job. The running set is one padded
  batch; when a job joins or leaves, the batch changes in place (a leaver's row takes the last
  row, a joiner's KV is copied into a free row) or, when it cannot, is rebuilt from each job's
  KV (``profiles.decode_layout.PaddedDecodeBatch`` decides which, and where the rows end: every
  row is computed over the batch's common end, and a profile of this engine prices the step
  there). Those copies are a real cost of this engine, which the profile's decode grid does
  not contain: they are reported apart.
* **Time**: the harness runs on a wall clock (``simpy.rt``); an iteration measures its own work
  (moves, copies, forward) and is stamped with the wall instants it began and ended, and the
  clock moves to its end's wall instant. Events that fell due while it worked are handled
  right after it, stamped with their own times: for searches of recorded or modelled
  duration that is exactly what concurrent workers would have done. The engine's thread
  spends time between two iterations too (the pipeline's events, choosing the next batch,
  handing first tokens back): it lies between one iteration's end and the next one's start,
  on the clock as on the wall, and is counted where the engine did not wait for work in
  between (``between_steps_s``, ``between_steps``), as the vLLM run counts its own. Before,
  an iteration yielded its own duration only, so the clock fell behind the wall by that time
  (1.3 ms at the median of a 50% load, up to 11 ms) and the run's TTFTs left it out
  (docs/validation.md, "The torch run's clock").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic, perf_counter, thread_time
from typing import Any

import simpy

from ragsim.cache.tree import KnowledgeTree
from ragsim.profiles.decode_layout import PaddedDecodeBatch, decode_buffer_shape
from ragsim.profiles.profile import Profile
from ragsim.profiles.torch_model import (
    Batch,
    LayerKV,
    Row,
    TorchModel,
    decode_buffer,
    decode_step_batch,
    joiners_decode_cache,
    write_joiner,
)
from ragsim.realrun.blend import PlacedKV, prefill_request
from ragsim.realrun.engine import KVStore, NodeKV, kv_tokens
from ragsim.realrun.tokens import PromptTokens
from ragsim.serving.engine import Job, PrefillTiming, Wait


def _release(layers: list, storage: list | None, index: int) -> None:
    """Drop a discarded decode batch's tensors of layer ``index`` (and the row storage's, the
    same buffers), so that their memory is free before the rest of a rebuild allocates."""
    layers[index].release()
    if storage is not None:
        storage[index] = None


@dataclass
class EngineTimes:
    """Where the real engine's time went (seconds), beside what the profile models."""

    prefill_s: float = 0.0
    prefill_passes: int = 0
    second_passes: int = 0  # rows that waited for a batch mate's KV (batch_kv_sharing)
    swap_in_s: float = 0.0
    moves_s: float = 0.0  # swap-outs, frees and drops carried out
    layerwise_swap_ins: int = 0  # nodes copied layer by layer during a prefill
    decode_s: float = 0.0
    decode_steps: int = 0
    decode_rebuilds: int = 0  # the whole batch copied into a new buffer
    decode_reshapes: int = 0  # rows left and joined in place
    decode_rebuild_s: float = 0.0  # both
    recover_s: float = 0.0
    blended_prefills: int = 0  # jobs prefilled with position-free hits (one pass each)
    # what those prefills reused outside the exact prefix and recomputed of it, counted from
    # the blended prefills themselves (the core's counts: position_free_hit_tokens,
    # blend_recomputed_tokens)
    position_free_hit_tokens: int = 0
    blend_recomputed_tokens: int = 0
    moves: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {f"engine_{k}": v for k, v in self.__dict__.items()}


class LayerwiseSwapIn:
    """Host hits copied to the device layer by layer while the prefill computes
    (``--overlap-swap``; the simulator prices such an iteration at max(compute, copy)).

    Each node's GPU tensors are allocated at once (``KVStore.begin_swap_in``); the forward pass
    reads a layer's cached KV only after ``before_layer`` for that layer. On CUDA every layer's
    copies are queued at once on their own stream, from pinned host memory, each layer closed by
    an event the compute stream waits for: layer ``l`` computes while later layers are still
    copied. A CPU has no copy engine, so there each layer is copied when the pass reaches it:
    the same order and data, without the overlap (and ``copy_s`` is the time those copies took).
    """

    def __init__(self, store: KVStore, nodes: list, num_layers: int) -> None:
        self.store = store
        self.layers = [[] for _ in range(num_layers)]  # layer -> [(host pair, device pair)]
        for node in nodes:
            for layer, pair in enumerate(store.begin_swap_in(node)):
                self.layers[layer].append(pair)
        self.copied = [False] * num_layers
        self.copy_s = 0.0
        self._events = None
        if store.device.type == "cuda":
            torch = store.torch
            self._stream = torch.cuda.Stream(device=store.device)
            self._start = torch.cuda.Event(enable_timing=True)
            self._events = []
            self._start.record(torch.cuda.current_stream(store.device))
            with torch.cuda.stream(self._stream):
                # the device tensors were allocated on the compute stream
                self._stream.wait_stream(torch.cuda.current_stream(store.device))
                for pairs in self.layers:
                    for host, device in pairs:
                        for t in device:
                            t.record_stream(self._stream)
                        store.copy_layer(host, device)
                    event = torch.cuda.Event(enable_timing=True)
                    event.record(self._stream)
                    self._events.append(event)

    @property
    def overlapped(self) -> bool:
        """Whether the copies ran beside the compute (CUDA), not inside the pass (CPU)."""
        return self._events is not None

    def before_layer(self, layer: int) -> None:
        if self._events is not None:
            self.store.torch.cuda.current_stream(self.store.device).wait_event(
                self._events[layer])
            return
        if not self.copied[layer]:
            started = perf_counter()
            for host, device in self.layers[layer]:
                self.store.copy_layer(host, device)
            self.copy_s += perf_counter() - started
            self.copied[layer] = True

    def finish(self) -> float:
        """Every layer copied (a pass that did not reach some layer still owes them); returns
        the copies' own time."""
        for layer in range(len(self.layers)):
            self.before_layer(layer)
        if self._events is not None:
            self._events[-1].synchronize()
            self.copy_s = self._start.elapsed_time(self._events[-1]) / 1e3
        return self.copy_s


@dataclass
class _Running:
    """A job between its prefill and its end: its whole context's KV and its next input."""

    kv: list | None  # per layer (keys, values), each a tensor or chunks along the token axis;
    #                   None once the job's row is in the decode batch
    next_token: int
    tokens: int  # in kv


class TorchIterations:
    """``Iterations`` on a real model, with the tree's nodes held in a ``KVStore``."""

    def __init__(self, env: simpy.Environment, tree: KnowledgeTree, model: TorchModel,
                 store: KVStore, tokens: PromptTokens, profile: Profile, *,
                 overlap_swap: bool = False) -> None:
        if not tree.record_moves:
            raise ValueError("the real engine follows the tree's moves: record_moves=True")
        self.env = env
        self.tree = tree
        self.model = model
        self.store = store
        self.tokens = tokens
        self._h2d = profile.transfers.host_to_device_s
        self.overlap_swap = overlap_swap  # host hits copied layer by layer during the prefill
        self._swapping: LayerwiseSwapIn | None = None
        self.times = EngineTimes()
        # every iteration as it ran: what the profile is compared with (``cost_model_errors``)
        # ("prefill", cached list, new list, seconds, copy seconds, pause) or ("decode", batch
        # size, mean context, seconds, changed (rebuilt or changed in place), pause, padded
        # context); pause: the engine's idle time before the iteration (inf for the first),
        # which a profile's cold start prices; padded context: the batch's common end, which
        # a profile of a padded decode (``decode_padding``) prices
        self.log: list[tuple] = []
        # the engine's time between two iterations where it did not wait for work in between
        # (its loop: what ``realrun.probe_runs`` fits ``EngineLoop`` on), and how many such gaps
        self.between_steps_s = 0.0
        self.between_steps = 0
        # jobs whose prefill began as the step before it ended: the loop's time per request
        # is fitted on them (the simulator charges it with each request's first prompt chunk)
        self.requests_after_step = 0
        self._last_end_s: float | None = None  # the clock at the last iteration's end
        self._after_step = False  # the iteration under way began as the one before it ended
        # the same iterations as decisions (``ragsim.decisions``): when each started on the
        # run's clock, which jobs it ran and what the simulator's costs need to price it
        self.decisions: list[dict] = []
        # the seconds the iteration under way has spent in its timed passes (the model's
        # ``prepare``, ``forward`` and ``decode`` to their sync, what a profile's cells time):
        # each decision keeps them (``passes_s``), so that the rest of its time, the engine's
        # own work around the passes, can be measured apart (``realrun.probe_runs``)
        self._passes_s = 0.0
        # the engine thread's CPU time when the iteration under way began: each decision keeps
        # what the iteration took of it (``engine_cpu_s``), so that a step's wall time it was
        # not running (waiting for the interpreter's lock, or its core taken) shows apart from
        # the work it did (docs/validation.md, "Run BC")
        self._cpu_began = 0.0
        self._pending: set = set()  # nodes admitted to GPU whose KV a prefill still computes
        self._deferred: list[tuple[str, Any]] = []  # moves on pending nodes, in order
        self._running: dict[Job, _Running] = {}
        self._decode_order: list[Job] = []  # rows of the decode batch
        self._decode_batch = None
        self._row_storage: list | None = None  # per layer [keys, values]: the batch's rows
        # the rows the last rebuild or reshape wrote (each to the batch's common end)
        self._written_rows = 0
        # where the batch's rows end and when it is rebuilt: the rule the simulator prices
        # the same steps by (``profiles.decode_layout``, a profile's decode_padding)
        self.layout = PaddedDecodeBatch()
        self._root_host: NodeKV | None = None
        # node -> the position of its first token when its KV was computed (a node's KV is
        # stored at its own positions; a position-free hit moves it from there)
        self._positions: dict[Any, int] = {}
        # request -> the tokens its latest attempt generated (greedy; exactness is tested on it)
        self.outputs: dict[int, list[int]] = {}
        # with ``record_logits``: request -> (logits of its first token, of its latest), so a
        # test can hold cached generation to a tolerance, not only to the same argmax
        self.record_logits = False
        self.logits: dict[int, tuple[Any, Any]] = {}
        self._store_root()

    # ------------------------------------------------------------------ the tree's moves
    def _store_root(self) -> None:
        """Compute the system prompt's KV once and keep it as the root node (and a host copy,
        from which a GPU failure is recovered)."""
        system = self.tokens.system
        if not len(system):
            return
        kv = self.model.prefill([Row(None, system, 0)]).new_kv[0]
        self.store.put(self.tree.root, kv)
        self._root_host = [(k.to("cpu", copy=True), v.to("cpu", copy=True)) for k, v in kv]

    def _apply_moves(self, layerwise: list | None = None) -> float:
        """Carry out the tree's moves since the last call; returns the seconds spent on
        swap-ins (host->GPU copies a prefill waits for). With ``layerwise`` the swap-ins are
        not copied here: their nodes are listed there, for a ``LayerwiseSwapIn``."""
        swap_in_s = 0.0
        counts = self.times.moves
        for move in self.tree.drain_moves():
            kind, node = move.kind, move.node
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "admit_gpu":
                self._pending.add(node)
            elif node in self._pending:
                self._on_pending(kind, node)
            elif kind == "swap_in" and layerwise is not None:
                layerwise.append(node)
            elif kind == "swap_in":
                started = perf_counter()
                self.store.apply(kind, node)
                self.model.sync()
                swap_in_s += perf_counter() - started
            else:
                self.store.apply(kind, node)
        return swap_in_s

    def _on_pending(self, kind: str, node: Any) -> None:
        """A move on a node whose KV is not computed yet: losing the GPU copy cancels the
        store; a copy to the host waits until the KV exists."""
        if kind in ("free_gpu", "fail_gpu", "drop"):
            self._pending.discard(node)
            self._deferred = [(k, n) for k, n in self._deferred if n is not node]
        else:
            self._deferred.append((kind, node))

    def _stored(self, node: Any, kv: NodeKV, position: int) -> None:
        self._pending.discard(node)
        self.store.put(node, kv)
        self._positions[node] = position
        if self._deferred:
            later = [(k, n) for k, n in self._deferred if n is node]
            self._deferred = [(k, n) for k, n in self._deferred if n is not node]
            for kind, n in later:
                self.store.apply(kind, n)

    # ------------------------------------------------------------------ prefill
    @staticmethod
    def _exact_prefix_tokens(job: Job) -> int:
        """Of the job's reused ``alpha`` tokens, those of its exact prefix (the rest are its
        position-free hits less what it recomputes of them)."""
        return job.alpha - job.free_hit_tokens + job.blend_recomputed

    def _prefix(self, job: Job) -> list[tuple[list, list]] | None:
        """The KV of the job's exact prefix, per layer as chunks along the token axis: the
        root's, then its path's nodes', the last cut to the prefix (a block-granular engine
        reuses whole blocks only; views, not copies: the batch copies them once)."""
        alpha = self._exact_prefix_tokens(job)
        if not alpha:
            return None
        parts: list[NodeKV] = []
        have = 0
        for node in [self.tree.root, *(job.path or ())]:
            if have >= alpha:
                break
            if node is self.tree.root and not self.tree.system_prompt_tokens:
                continue
            kv = self.store.get(node)
            n = kv_tokens(kv)
            if have + n > alpha:  # a block-granular engine reuses part of this node
                kv = [(k[:, :alpha - have], v[:, :alpha - have]) for k, v in kv]
                n = alpha - have
            parts.append(kv)
            have += n
        if have < alpha:
            raise AssertionError(f"request {job.request}: {alpha} tokens reused, {have} stored")
        return [([p[layer][0] for p in parts], [p[layer][1] for p in parts])
                for layer in range(self.model.num_layers)]

    def _waits_for_batch_mate(self, job: Job) -> bool:
        """Whether the job's reused prefix, or a node it reads position-free, is not
        computed yet."""
        if not self._pending:
            return False
        if any(node in self._pending for node in job.free_nodes):
            return True
        exact = self._exact_prefix_tokens(job)
        start = self.tree.system_prompt_tokens
        for node in job.path or ():
            if start >= exact:
                return False
            if node in self._pending:
                return True
            start += node.tokens
        return False

    def _store_computed(self, job: Job, new_kv: list[LayerKV]) -> None:
        """Store the KV of the job's pending nodes that its row computed (``new_kv``: per
        layer, the row's new tokens, views into the batch)."""
        start = self.tree.system_prompt_tokens
        for node in job.path or ():
            end = start + node.tokens
            if node in self._pending and start >= job.alpha:
                lo, hi = start - job.alpha, end - job.alpha
                self._stored(node, [(k[:, lo:hi].clone(), v[:, lo:hi].clone())
                                    for k, v in new_kv], start)
            start = end

    def _prefill_blended(self, job: Job) -> None:
        """A job with position-free hits, alone: its exact prefix's KV, every document it
        reads position-free moved into place and partly recomputed (``prefill_request``, with
        the tree's rule), the rest computed; its new path nodes keep the blended KV."""
        ids = self.tokens.of(job.docs, job.doc_tokens, job.request, job.query_tokens)
        if len(ids) != job.alpha + job.beta:
            raise AssertionError(f"request {job.request}: context of {len(ids)} tokens, "
                                 f"the engine counts {job.alpha} + {job.beta}")
        if self._swapping is not None:  # the blend reads every layer's prefix at once
            for layer in range(self.model.num_layers):
                self._swapping.before_layer(layer)
        stored = {node.key: PlacedKV(self.store.read(node), self._positions[node])
                  for node in job.free_nodes}
        documents, start = [], self.tree.system_prompt_tokens
        for doc, tokens in zip(job.docs, job.doc_tokens, strict=True):
            documents.append((doc, start, tokens))
            start += tokens
        began = perf_counter()
        out = prefill_request(self.model, ids, prefix_kv=self._prefix(job),
                              documents=documents, stored=stored, rule=self.tree.reuse)
        self.model.sync()
        self._passes_s += perf_counter() - began
        result = out.result
        if len(result.computed) != job.beta:
            raise AssertionError(f"request {job.request}: the blended prefill computed "
                                 f"{len(result.computed)} tokens, the engine counts {job.beta}")
        self.times.blended_prefills += 1
        self.times.position_free_hit_tokens += sum(stored[d].tokens for d in out.reused_ids)
        self.times.blend_recomputed_tokens += result.recomputed_tokens
        exact = self._exact_prefix_tokens(job)
        start = self.tree.system_prompt_tokens
        for node in job.path or ():
            if node in self._pending and start >= exact:
                self._stored(node, out.documents[node.key].kv, start)
            start += node.tokens
        next_id = int(result.logits.argmax())
        self._running[job] = _Running([([k], [v]) for k, v in result.kv], next_id, len(ids))
        self.outputs[job.request] = [next_id]
        if self.record_logits:
            first = result.logits.detach().to("cpu", copy=True)
            self.logits[job.request] = (first, first)
        self.times.prefill_passes += 1

    def _prefill_pass(self, jobs: list[Job]) -> None:
        for job in [j for j in jobs if j.free_nodes]:
            self._prefill_blended(job)
        jobs = [j for j in jobs if not j.free_nodes]
        if not jobs:
            return
        rows, contexts = [], []
        for job in jobs:
            ids = self.tokens.of(job.docs, job.doc_tokens, job.request, job.query_tokens)
            if len(ids) != job.alpha + job.beta:
                raise AssertionError(f"request {job.request}: context of {len(ids)} tokens, "
                                     f"the engine counts {job.alpha} + {job.beta}")
            rows.append(Row(self._prefix(job), ids[job.alpha:], job.alpha))
            contexts.append(len(ids))
        swapping = self._swapping
        began = perf_counter()
        batch = self.model.prepare(rows, lazy=swapping is not None)
        logits = self.model.forward(batch, None if swapping is None else swapping.before_layer)
        self.model.sync()
        self._passes_s += perf_counter() - began
        next_ids = self.model.greedy(logits)
        layers = batch.cache.layers[:self.model.num_layers]
        end = int(layers[0].keys.shape[-2])  # a row's new tokens are its last ones
        for row, job in enumerate(jobs):
            b = batch.new_lengths[row]
            new_kv = [(layer.keys[row, :, end - b:end], layer.values[row, :, end - b:end])
                      for layer in layers]
            self._store_computed(job, new_kv)
            prefix = rows[row].cached
            kv = [([k], [v]) for k, v in new_kv] if prefix is None else [
                ([*pk, k], [*pv, v]) for (pk, pv), (k, v) in zip(prefix, new_kv, strict=True)]
            self._running[job] = _Running(kv, int(next_ids[row]), contexts[row])
            self.outputs[job.request] = [int(next_ids[row])]
            if self.record_logits:
                first = logits[row].detach().to("cpu", copy=True)
                self.logits[job.request] = (first, first)
        self.times.prefill_passes += 1

    def _pause_s(self) -> float:
        """How long the engine sat idle before the iteration recorded last (inf: the first; 0
        where it began as the one before it ended: the time between them was its loop's, not
        a pause, as the simulator's steps count it)."""
        if len(self.decisions) < 2:
            return float("inf")
        if self._after_step:
            return 0.0
        return max(0.0, self.decisions[-1]["start_s"] - self.decisions[-2]["end_s"])

    def _begin(self) -> float:
        """The run's clock at the wall instant this iteration begins (past ``env.now`` by the
        engine's own time since it was last advanced), the gap since the last iteration's end
        counted as the loop's where the engine did not wait for work in between (the clock has
        not moved since that end: only a wait moves it)."""
        start_s = max(self.env.now, self.env.env_time(monotonic()))
        self._passes_s = 0.0
        self._cpu_began = thread_time()
        self._after_step = self._last_end_s is not None and self.env.now == self._last_end_s
        if self._after_step:
            self.between_steps_s += start_s - self._last_end_s
            self.between_steps += 1
        return start_s

    def _end(self):
        """The iteration's end: stamped with its wall instant, and the clock moved there
        (events that fell due meanwhile are handled first, with their own times)."""
        end_s = max(self.env.now, self.env.env_time(monotonic()))
        self.decisions[-1]["end_s"] = end_s
        self.decisions[-1]["passes_s"] = self._passes_s
        self.decisions[-1]["engine_cpu_s"] = thread_time() - self._cpu_began
        yield self.env.timeout(end_s - self.env.now)
        self._last_end_s = self.env.now

    def prefill(self, jobs: list[Job]) -> Wait:
        self.decisions.append({"kind": "prefill", "start_s": self._begin(),
                               "jobs": [(j.key, j.request, j.alpha, j.beta, j.swap_in_bytes)
                                        for j in jobs]})
        if self._after_step:
            self.requests_after_step += len(jobs)
        started = perf_counter()
        layerwise: list | None = [] if self.overlap_swap else None
        copy_s = self._apply_moves(layerwise)
        exposed_copy_s = copy_s  # the copy time the prefill waited for
        moves_s = -copy_s
        if layerwise:
            self._swapping = LayerwiseSwapIn(self.store, layerwise, self.model.num_layers)
        moves_s += perf_counter() - started
        try:
            waiting = list(jobs)
            while waiting:
                now = [j for j in waiting if not self._waits_for_batch_mate(j)]
                if not now:
                    raise AssertionError("a batch waits on KV no request of it computes")
                if len(now) < len(waiting):
                    self.times.second_passes += len(waiting) - len(now)
                self._prefill_pass(now)
                waiting = [j for j in waiting if j not in now]
        finally:
            if self._swapping is not None:
                copy_s = self._swapping.finish()
                # a CPU copies each layer inside the pass (no copy engine): all of it exposed;
                # on CUDA the copies ran beside the compute (the part not hidden is not
                # measured: counted as hidden)
                exposed_copy_s = 0.0 if self._swapping.overlapped else copy_s
                self.times.layerwise_swap_ins += len(layerwise)
                self._swapping = None
        duration = perf_counter() - started
        compute_s = duration - exposed_copy_s
        self.decisions[-1]["swap_copy_s"] = exposed_copy_s
        self.log.append(("prefill", [j.alpha for j in jobs], [j.beta for j in jobs],
                         compute_s, copy_s, self._pause_s()))
        self.times.swap_in_s += copy_s
        self.times.moves_s += moves_s
        self.times.prefill_s += duration
        yield from self._end()
        return PrefillTiming(duration_s=duration, compute_s=compute_s, copy_s=copy_s)

    # ------------------------------------------------------------------ decode
    def _rebuild(self, members: set[Job]) -> tuple[Batch, list[Job]]:
        """The decode batch for ``members``: rows that ran the last step are copied from its
        cache, rows that join from their prefill's KV, each once, into a buffer zeroed only
        where rows are padded. Every row's KV ends at the same index (left padding, masked), so
        a step appends every row's token at one position. Used when the batch cannot change
        in place, or should not (``self.layout`` says which: the first batch, a joiner longer
        than the rows' common end, more rows than the buffer holds, no row of the last step
        staying, an end past twice the longest row). The buffer keeps room for a quarter more
        rows."""
        model = self.model
        old, old_order = self._decode_batch, self._decode_order
        kept = [j for j in old_order if j in members] if old is not None else []
        kept_set = set(kept)
        joined = sorted((j for j in members if j not in kept_set), key=lambda j: j.key)
        order = kept + joined
        lengths = [self._running[j].tokens for j in order]
        longest = max(lengths)
        # the old batch's memory goes as soon as nothing more is read from it (all of it now
        # when no row stays, else each layer once copied): on a GPU the old and the new batch
        # together were what ran out of memory (ragsim/realrun/memory.py)
        old_storage, self._row_storage = self._row_storage, None
        if not kept:  # only joiners: the batch the profiler times (``decode_after_prompt``)
            if old is not None:
                for layer in range(model.num_layers):
                    _release(old.cache.layers, old_storage, layer)
            cache, storage, _ = joiners_decode_cache(
                model, [self._running[j].kv for j in joined], lengths)
        else:
            cache, storage = self._kept_and_joined(old, old_order, old_storage, kept, joined,
                                                   lengths)
        for job in joined:
            self._running[job].kv = None  # its KV lives in the batch from now on
        self._row_storage = storage
        self.times.decode_rebuilds += 1
        self._written_rows = len(order)  # every row, to the common end
        return self._new_decode_batch(cache, order, longest)

    def _kept_and_joined(self, old: Batch, old_order: list[Job], old_storage: list | None,
                         kept: list[Job], joined: list[Job], lengths: list[int]
                         ) -> tuple[Any, list]:
        """``_rebuild``'s new buffers where rows of the last step stay: theirs copied from its
        cache (each old layer released once copied), the joiners' from their own KV."""
        model = self.model
        n, longest = len(lengths), max(lengths)
        rows, buffer_tokens = decode_buffer_shape(n, longest)
        cache = model.new_cache()
        where = {j: i for i, j in enumerate(old_order)}
        old_rows = [where[j] for j in kept]
        old_layers = old.cache.layers[:model.num_layers]
        old_total = int(old_layers[0].keys.shape[-2])
        take = min(longest, old_total)
        storage = []
        for layer in range(model.num_layers):
            pair = []
            for side in (0, 1):
                # written once: each row's KV where it belongs, zeros only in its padding, and
                # room after it for the tokens to come (appended in place)
                buffer = decode_buffer(model, rows, buffer_tokens)
                source = old_layers[layer].keys if side == 0 else old_layers[layer].values
                for row, old_row in enumerate(old_rows):
                    buffer[row, :, longest - take:longest] = source[old_row, :,
                                                                    old_total - take:]
                if longest > take:
                    buffer[:len(kept), :, :longest - take].zero_()
                del source  # a view of the old buffer: held, it outlives its release
                for row, job in enumerate(joined, start=len(kept)):
                    write_joiner(buffer, row, longest, lengths[row],
                                 self._running[job].kv[layer][side])
                pair.append(buffer)
            _release(old_layers, old_storage, layer)
            storage.append(pair)
            cache.layers[layer].adopt(pair[0][:n], pair[1][:n], longest)
        return cache, storage

    def _reshape(self, members: set[Job]) -> tuple[Batch, list[Job]] | None:
        """The decode batch for ``members``, changed in place: a row that left takes the last
        row (one row copied), a joiner is written into the next free row (its own KV and the
        zeros of its padding). The rows that stay are not copied, as a paged engine copies
        none of its running KV when its batch changes; rebuilding the whole batch at every join
        and leave took 28 of a 49 s overload run. Called where ``self.layout`` keeps the
        batch."""
        old, order = self._decode_batch, self._decode_order
        model = self.model
        layers = old.cache.layers[:model.num_layers]
        if layers[0]._keys_buffer.data_ptr() != self._row_storage[0][0].data_ptr():
            # the cache outgrew the buffer and moved to a bigger one (of exactly its rows)
            self._row_storage = [[layer._keys_buffer, layer._values_buffer]
                                 for layer in layers]
        storage = self._row_storage
        end = int(layers[0].keys.shape[-2])  # where every row's KV ends
        in_batch = set(order)
        joined = sorted((j for j in members if j not in in_batch), key=lambda j: j.key)
        if (end != self.layout.end_tokens or len(members) > storage[0][0].shape[0]
                or any(self._running[j].tokens > end for j in joined)):
            raise RuntimeError(  # the layout and the buffers disagree: a bug, never data
                f"the decode layout (end {self.layout.end_tokens}, {self.layout.buffer_rows} "
                f"rows) does not match the batch's buffers (end {end}, "
                f"{storage[0][0].shape[0]} rows) for {len(members)} rows")
        rows = list(order)
        moved = 0
        for row in sorted((r for r, j in enumerate(order) if j not in members), reverse=True):
            last = len(rows) - 1
            if row != last:  # the last row moves into the hole
                for pair in storage:
                    for buffer in pair:
                        buffer[row, :, :end].copy_(buffer[last, :, :end])
                rows[row] = rows[last]
                moved += 1
            rows.pop()
        for job in joined:
            row, length = len(rows), self._running[job].tokens
            for layer, pair in enumerate(storage):
                for side, buffer in enumerate(pair):
                    write_joiner(buffer, row, end, length, self._running[job].kv[layer][side])
            self._running[job].kv = None
            rows.append(job)
        n = len(rows)
        cache = model.new_cache()
        for layer, (keys, values) in enumerate(storage):
            cache.layers[layer].adopt(keys[:n], values[:n], end)
        self.times.decode_reshapes += 1
        self._written_rows = moved + len(joined)  # rows moved, rows joined
        return self._new_decode_batch(cache, rows, end)

    def _new_decode_batch(self, cache: Any, order: list[Job], end: int
                          ) -> tuple[Batch, list[Job]]:
        """The decode step's inputs for rows ``order`` whose KV ends at ``end`` in ``cache``:
        each row's next token, its position, and a mask of its own tokens when rows differ."""
        batch = decode_step_batch(self.model, cache, [self._running[j].tokens for j in order],
                                  end, [self._running[j].next_token for j in order])
        self._decode_batch, self._decode_order = batch, order
        return batch, order

    def decode(self, jobs: set[Job], mean_context_tokens: float) -> Wait:
        self.decisions.append({"kind": "decode", "start_s": self._begin(), "size": len(jobs),
                               "context_tokens": mean_context_tokens})
        started = perf_counter()
        order = self._decode_order
        changed = not self.layout.unchanged(jobs)  # its rows are the batch's rows
        rebuild = self.layout.plan(jobs, lambda j: self._running[j].tokens)
        if not changed:
            began = perf_counter()
            logits = self.model.decode(self._decode_batch,
                                       [self._running[j].next_token for j in order])
        else:
            rebuild_started = perf_counter()
            batch, order = self._rebuild(jobs) if rebuild else self._reshape(jobs)
            self.model.sync()
            copy_s = perf_counter() - rebuild_started
            self.times.decode_rebuild_s += copy_s
            # what the step spent laying out its batch, apart from its forward pass (the
            # profile's ``batch_copy`` prices it; a run's ``steps.parquet`` keeps
            # ``batch_change``, ``batch_copy_s`` and ``batch_row_tokens`` to check it by)
            # each row written to the batch's end, which the layout holds until ``advance``
            wrote = self._written_rows
            self.decisions[-1].update(batch_change="rebuild" if rebuild else "reshape",
                                      batch_copy_s=copy_s, batch_rows=wrote,
                                      batch_row_tokens=wrote * self.layout.end_tokens)
            # the simulator prices the rows its layout says: a rebuild's exactly these, a
            # change in place's at most one moved row per leaver more (it knows no row order)
            said = self.layout.written_rows
            if said != wrote if rebuild else said < wrote:
                raise RuntimeError(f"the decode batch wrote {wrote} rows, its layout says "
                                   f"{said}: the layout's rule is "
                                   "not the engine's (a bug, never data)")
            began = perf_counter()
            logits = self.model.forward(batch)
        self.layout.advance()
        # the step computed every row over the batch's common end, as its cache holds it
        # (KV tokens with the step's own: the serving engine's context frame, as
        # ``mean_context_tokens``); the layout the simulator prices by must have it there
        padded = int(self._decode_batch.cache.layers[0].keys.shape[-2])
        if padded != self.layout.end_tokens:
            raise RuntimeError(f"the decode batch ends at {padded} tokens, its layout at "
                               f"{self.layout.end_tokens}: the layout's rule is not the "
                               "engine's (a bug, never data)")
        self.decisions[-1]["padded_context_tokens"] = padded
        self.model.sync()
        self._passes_s += perf_counter() - began
        for row, (job, token) in enumerate(zip(order, self.model.greedy(logits),
                                               strict=True)):
            state = self._running[job]
            state.next_token = int(token)
            state.tokens += 1
            self.outputs[job.request].append(int(token))
            if self.record_logits:
                self.logits[job.request] = (self.logits[job.request][0],
                                            logits[row].detach().to("cpu", copy=True))
        duration = perf_counter() - started
        self.log.append(("decode", len(order), mean_context_tokens, duration, changed,
                         self._pause_s(), padded))
        self.times.decode_s += duration
        self.times.decode_steps += 1
        yield from self._end()
        return duration

    def leave(self, job: Job) -> None:
        # its row stays in the decode batch until the next step rebuilds it without the job
        self._running.pop(job, None)

    # ------------------------------------------------------------------ faults
    def gpu_failed(self) -> None:
        """Everything on the GPU is gone: running jobs' KV, the decode batch, the nodes the
        tree dropped (its moves) and the system prompt (recovered by ``recover``)."""
        self._running.clear()
        self._decode_batch = None
        self._row_storage = None
        self._decode_order = []
        self.layout.reset()
        self._apply_moves()
        root = self.tree.root
        if self.store.tier(root) == "gpu":
            self.store.free_gpu(root)

    def recovery_s(self, restart_s: float, root_bytes: int) -> float:
        return restart_s + self._h2d(root_bytes)

    def recover(self, restart_s: float, root_bytes: int) -> Wait:
        yield self.env.timeout(restart_s)
        started = perf_counter()
        if self._root_host is not None and self.store.tier(self.tree.root) != "gpu":
            self.store.put(self.tree.root, [(k.to(self.store.device, copy=True),
                                             v.to(self.store.device, copy=True))
                                            for k, v in self._root_host])
            self.model.sync()
        copied = perf_counter() - started
        self.times.recover_s += copied
        yield self.env.timeout(copied)
