"""RAGPulse: the importer on a sample of the published files (tests/data/ragpulse_sample), the
built-in ``ragpulse`` (the published files, shipped), and every bad-input case.

The expected counts are worked out here from the raw JSON lines by a second, deliberately
plain reading (``RawRequest``): the path is the system-prompt segments then the passages as
listed, and a request at unlimited memory hits the tokens of the longest path prefix some
earlier request had. Nothing here calls the importer to get an expected value.
"""

from __future__ import annotations

import json
import lzma
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_readers import FUZZ, JUNK, SCALARS, _workdir, assert_clean
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.errors import TraceError
from ragsim.traces import packaged_trace_dir, read_trace, resolve_trace
from ragsim.traces.ragpulse import SYSTEM_PROMPT_DOC_ID_BASE, read_ragpulse

runner = CliRunner()
SAMPLE = Path(__file__).resolve().parent / "data" / "ragpulse_sample"
WEEK_S = 604_800
LENGTH_FILES = {"sys_prompt": ("1_sys_prompt.jsonl", "sys_prompt_id"),
                "passages_ids": ("2_passages.jsonl", "passage_id"),
                "history": ("3_history.jsonl", "history_id"),
                "user_input": ("4_user_input.jsonl", "user_input_id"),
                "web_search": ("5_web_search.jsonl", "web_search_id")}


# --------------------------------------------------------------------------- the second reading
def _text(folder: Path, name: str) -> str:
    plain = folder / name
    if plain.exists():
        return plain.read_text()
    return lzma.decompress((folder / f"{name}.xz").read_bytes()).decode()


@dataclass
class RawRequest:
    line: int
    timestamp: int
    input_length: int
    output_length: int
    session: str
    path: list[tuple[str, int]]  # ("sys", id) / ("passage", id), as listed
    path_tokens: list[int]


def raw_requests(folder: Path, clock: str = "weeks") -> list[RawRequest]:
    """The requests in arrival order: on the weekly clock, each time the file's timestamp goes
    back, a week later; ties (and, sorted, everything) in file order."""
    lengths = {}
    for key, (name, id_field) in LENGTH_FILES.items():
        lengths[key] = {}
        for line in _text(folder, name).splitlines():
            if line.strip():
                row = json.loads(line)
                lengths[key][row[id_field]] = row["token_length"]
    requests, week, previous = [], 0, None
    for number, line in enumerate(_text(folder, "0_trace.jsonl").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        stamp = int(row["timestamp"])
        if clock == "weeks" and previous is not None and stamp < previous:
            week += 1
        previous = stamp
        ids = row["hash_ids"]
        path = [("sys", s) for s in ids["sys_prompt"]] + [("passage", p)
                                                           for p in ids["passages_ids"]]
        tokens = ([lengths["sys_prompt"][s] for s in ids["sys_prompt"]]
                  + [lengths["passages_ids"][p] for p in ids["passages_ids"]])
        requests.append(RawRequest(number, stamp + WEEK_S * week, row["input_length"],
                                   row["output_length"], row["session_id"], path, tokens))
    return sorted(requests, key=lambda r: (r.timestamp, r.line))


def hits_by_brute_force(requests: list[RawRequest]) -> list[int]:
    """Tokens of each request's longest path prefix that an earlier request's path shares
    (compared one earlier request at a time)."""
    hits = []
    for i, r in enumerate(requests):
        best = 0
        for earlier in requests[:i]:
            n = 0
            while n < min(len(r.path), len(earlier.path)) and r.path[n] == earlier.path[n]:
                n += 1
            best = max(best, n)
        hits.append(sum(r.path_tokens[:best]))
    return hits


def hits_by_prefix_set(requests: list[RawRequest]) -> list[int]:
    """The same count for long traces: the set of every earlier request's path prefixes."""
    seen, hits = set(), []
    for r in requests:
        n = 0
        while n < len(r.path) and tuple(r.path[:n + 1]) in seen:
            n += 1
        hits.append(sum(r.path_tokens[:n]))
        seen.update(tuple(r.path[:d + 1]) for d in range(len(r.path)))
    return hits


def replay_unlimited(trace: str) -> dict:
    result = runner.invoke(app, ["replay", "--trace", trace, "--gpu-mem", "64TiB",
                                 "--host-mem", "64TiB", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- the sample
def test_the_sample_is_what_its_readme_says():
    lines = (SAMPLE / "0_trace.jsonl").read_text().split("\n")
    assert sum(1 for x in lines if x.strip()) == 58
    assert "" in lines[:-2]  # a blank line inside the file, and the published blank last line
    rows = raw_requests(SAMPLE)
    stamps = [r.timestamp for r in rows]
    assert len(set(stamps)) < len(stamps)  # ties
    assert any(len(set(r.path)) < len(r.path) for r in rows)  # a passage listed twice
    assert any(not any(k == "passage" for k, _ in r.path) for r in rows)  # no passages
    assert any(b.timestamp >= WEEK_S for b in rows)  # the second week's block


def test_hand_worked_paths_queries_and_hits(tmp_path):
    trace = read_ragpulse(SAMPLE)
    sp = SYSTEM_PROMPT_DOC_ID_BASE
    by_line = {}
    order = [r.line for r in raw_requests(SAMPLE)]
    for i, line in enumerate(order):
        by_line[line] = i
    # file line 1 (timestamp 82): segments 8302, 14332 (512 each), 15199 (437), then passages
    # 7398, 7370, 7098, 6967, 7405, 7298 (113 + 150 + 355 + 346 + 326 + 334 = 1,624): a path of
    # 3,085 tokens; input_length 3,112 leaves 27 for the query (history 11, user input 7,
    # template 9)
    first = by_line[1]
    assert first == 0
    assert trace.docs_of(0).tolist() == [sp + 8302, sp + 14332, sp + 15199, 7398, 7370, 7098,
                                         6967, 7405, 7298]
    assert int(trace.doc_tokens_flat[:9].sum()) == 3085
    assert (trace.query_tokens[0], trace.output_tokens[0]) == (27, 192)
    # line 34 lists passages 1417, 1416 and 1420 twice each: six positions of the path,
    # 1,461 + 2 * (327 + 204 + 324) = 3,171 tokens, query 3,203 - 3,171 = 32
    i = by_line[34]
    assert trace.docs_of(i).tolist() == [sp + 8302, sp + 14332, sp + 14911, 1417, 1417, 1416,
                                         1416, 1420, 1420]
    assert int(trace.tokens_of(trace.docs_of(i)).sum()) == 3171
    assert trace.query_tokens[i] == 32
    # line 5: no passages, only the three segments 8308, 15195 (512 each) and 8310 (4)
    i = by_line[5]
    assert trace.docs_of(i).tolist() == [sp + 8308, sp + 15195, sp + 8310]
    assert trace.query_tokens[i] == 1166 - 1028
    # line 38 (timestamp 0 after 599,362: the second week) arrives a week after the origin,
    # after lines 36 and 37 of the first week
    assert trace.arrival_s[by_line[38]] == WEEK_S
    assert by_line[38] == by_line[37] + 1 == by_line[36] + 2
    assert trace.session_id[by_line[1]].as_py() == "1757476916095-afhwfadnh5ew"

    out = tmp_path / "sample"
    result = runner.invoke(app, ["trace", "import-ragpulse", str(SAMPLE), str(out)])
    assert result.exit_code == 0, result.output
    replayed = pd_records(out)
    hits = replayed["hit_tokens_gpu"] + replayed["hit_tokens_host"]
    # line 2 shares segments 8302 and 14332 with line 1: 1,024 tokens
    assert hits[by_line[2]] == 1024
    # line 37 ties line 36 (timestamp 599,362) and follows it in file order: it hits their
    # common segments 8302, 11159, 11630 and passages 6681, 5860, 5863, 2405:
    # 1,461 + 109 + 333 + 328 + 339 = 2,570; line 36 only 8302 (512): 11159 is new there
    assert hits[by_line[37]] == 2570
    assert hits[by_line[36]] == 512
    # line 38, a week later, hits 8302 and 11159 (1,024), met in lines 36 and 37
    assert hits[by_line[38]] == 1024
    # line 59 repeats line 58's path whole: 1,461 + 192 + 370 + 211 + 343 + 319 + 327 =
    # 3,223 tokens hit, nothing of the path recomputed (its 870 query tokens are computed)
    assert hits[by_line[59]] == 3223
    assert replayed["recomputed_tokens"][by_line[59]] == 0
    # a passage listed twice is a second node below the first: line 34's second 1417 is new
    # (no earlier path has 1417 after 1417)
    assert hits[by_line[34]] == 1024


def pd_records(trace_dir: Path) -> dict[str, np.ndarray]:
    from ragsim.sim.replay import ReplayConfig, run_replay

    config = ReplayConfig(trace=str(trace_dir), policy="lru", gpu_capacity_bytes=2**46,
                          host_capacity_bytes=2**46)
    return run_replay(read_trace(trace_dir), config).columns


@pytest.mark.parametrize("clock", ["weeks", "sorted"])
def test_sample_replays_at_unlimited_memory_to_the_brute_force_count(tmp_path, clock):
    out = tmp_path / "sample"
    result = runner.invoke(app, ["trace", "import-ragpulse", str(SAMPLE), str(out),
                                 "--clock", clock])
    assert result.exit_code == 0, result.output
    rows = raw_requests(SAMPLE, clock)
    hits = hits_by_brute_force(rows)
    assert hits == hits_by_prefix_set(rows)  # the long traces' count, checked on the sample
    path_tokens = sum(sum(r.path_tokens) for r in rows)
    s = replay_unlimited(str(out))
    assert s["requests"] == len(rows) == 58
    assert s["doc_tokens"] == path_tokens
    assert s["recomputed_tokens"] == path_tokens - sum(hits)
    assert s["hit_tokens_gpu"] + s["hit_tokens_host"] == sum(hits)
    trace = read_trace(out)
    assert trace.arrival_s.tolist() == [float(r.timestamp) for r in rows]
    assert trace.output_tokens.tolist() == [r.output_length for r in rows]
    assert trace.query_tokens.tolist() == [r.input_length - sum(r.path_tokens) for r in rows]
    assert trace.session_id.to_pylist() == [r.session for r in rows]


def test_the_clocks_differ_where_the_second_week_starts():
    weeks, overlaid = raw_requests(SAMPLE, "weeks"), raw_requests(SAMPLE, "sorted")
    # on one clock the second week's first request (line 38, timestamp 0) comes first and
    # hits nothing; a week later it hits 1,024 tokens (above)
    assert overlaid[0].line == 38 and weeks[0].line == 1
    assert hits_by_brute_force(overlaid)[0] == 0


# --------------------------------------------------------------------------- the built-in
def test_builtin_is_the_published_trace_and_replays_to_the_independent_count():
    """The Done-when check on the whole published trace (7,106 requests, shipped compressed):
    the replay at unlimited memory against the prefix-set count of the raw lines."""
    folder = packaged_trace_dir("ragpulse")
    rows = raw_requests(folder)
    assert len(rows) == 7106 and len({r.session for r in rows}) == 3990
    hits = hits_by_prefix_set(rows)
    path_tokens = sum(sum(r.path_tokens) for r in rows)
    s = replay_unlimited("ragpulse")
    assert s["requests"] == 7106
    assert s["doc_tokens"] == path_tokens
    assert s["recomputed_tokens"] == path_tokens - sum(hits)
    # the numbers the docs quote (docs/traces.md): 18,636,552 path tokens, 35.3% hit
    assert path_tokens == 18_636_552
    assert sum(hits) / path_tokens == pytest.approx(0.3527, abs=5e-5)
    trace = resolve_trace("ragpulse")
    assert trace.arrival_s.tolist() == [float(r.timestamp) for r in rows]
    assert trace.info["builtin"] == "ragpulse" and trace.info["clock"] == "weeks"


def test_the_published_trace_on_one_clock_replays_to_the_independent_count(tmp_path):
    """The same check for the issue's literal reading: every timestamp on one clock, sorted
    stably (``--clock sorted``), imported by the CLI from the shipped published files."""
    folder = packaged_trace_dir("ragpulse")
    out = tmp_path / "sorted"
    result = runner.invoke(app, ["trace", "import-ragpulse", str(folder), str(out),
                                 "--clock", "sorted"])
    assert result.exit_code == 0, result.output
    rows = raw_requests(folder, "sorted")
    hits = hits_by_prefix_set(rows)
    path_tokens = sum(sum(r.path_tokens) for r in rows)
    s = replay_unlimited(str(out))
    assert s["requests"] == 7106
    assert s["doc_tokens"] == path_tokens == 18_636_552
    assert s["recomputed_tokens"] == path_tokens - sum(hits)
    assert read_trace(out).arrival_s.tolist() == [float(r.timestamp) for r in rows]


def test_builtin_published_facts():
    """What the issue measured on the files, seen through the importer."""
    trace = resolve_trace("ragpulse")
    sp = SYSTEM_PROMPT_DOC_ID_BASE
    system = trace.doc_ids >= sp
    n_system = np.add.reduceat(system.astype(int), trace.doc_offsets[:-1])
    assert (n_system == 3).all()
    passages = trace.top_k - n_system
    assert (passages == 6).sum() == 5454 and (passages == 0).sum() == 1465
    second = trace.doc_ids[trace.doc_offsets[:-1] + 1]
    third = trace.doc_ids[trace.doc_offsets[:-1] + 2]
    assert (len(np.unique(second)), len(np.unique(third))) == (1415, 5480)
    assert len(np.unique(trace.document_ids[trace.document_ids < sp])) == 8302
    template = trace.info["template_tokens_min"], trace.info["template_tokens_max"]
    assert template == (6, 12)
    assert trace.info["clock_blocks"][1]["first_line"] == 3801


def test_builtin_is_kept_read_only_and_each_caller_gets_its_own_info():
    first = resolve_trace("ragpulse")
    first.info["touched"] = True
    with pytest.raises(ValueError):
        first.arrival_s[0] = 1.0
    assert "touched" not in resolve_trace("ragpulse").info
    assert resolve_trace("ragpulse", n_requests=10).n_requests == 10


@pytest.mark.parametrize("args", [
    ["run", "--trace", "ragpulse", "--requests", "40", "--json"],
    ["run", "--trace", "ragpulse", "--requests", "40", "--rate", "0.5", "--json"],
    ["trace", "stats", "ragpulse", "--requests", "2000", "--json"],
])
def test_builtin_name_works_like_the_others(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)


def test_builtin_runs_on_its_own_arrivals_unless_a_rate_is_given(tmp_path):
    """The issue: ragpulse's own arrivals by default. Each request's recorded arrival is the
    trace's (read here from the packaged files' clock, not from the run's config), and --rate
    replaces them with Poisson arrivals."""
    own = resolve_trace("ragpulse", n_requests=40)
    result = runner.invoke(app, ["run", "--trace", "ragpulse", "--requests", "40", "--json",
                                 "--out", str(tmp_path / "own")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["arrival"] == "trace"
    records = pd.read_parquet(tmp_path / "own" / "requests.parquet").sort_values("request_id")
    assert np.allclose(records["arrival_s"].to_numpy(), own.arrival_s)
    result = runner.invoke(app, ["run", "--trace", "ragpulse", "--requests", "40", "--rate",
                                 "0.5", "--json", "--out", str(tmp_path / "poisson")])
    assert result.exit_code == 0, result.output
    poisson = pd.read_parquet(tmp_path / "poisson" / "requests.parquet")
    assert not np.allclose(np.sort(poisson["arrival_s"].to_numpy()),
                           own.arrival_s)


def test_a_sweep_over_ragpulse_gives_the_runs_it_stands_for(tmp_path):
    """The built-in name in a sweep: each point's row is the single run with its settings."""
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", "--set", "trace=ragpulse", "--set", "requests=60",
                                 "--axis", "policy=pgdsf,lru", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out / "results.parquet").set_index("policy")
    for policy in ("pgdsf", "lru"):
        single = runner.invoke(app, ["run", "--trace", "ragpulse", "--requests", "60",
                                     "--policy", policy, "--json"])
        assert single.exit_code == 0, single.output
        summary = json.loads(single.stdout)
        for field in ("token_hit_rate", "ttft_mean_s", "ttft_p90_s", "throughput_rps"):
            assert rows.loc[policy, field] == pytest.approx(summary[field]), field


def test_builtin_retimes_to_another_rate(tmp_path):
    out = tmp_path / "fast"
    result = runner.invoke(app, ["trace", "retime", "ragpulse", str(out), "--rate", "2"])
    assert result.exit_code == 0, result.output
    fast = read_trace(out)
    own = resolve_trace("ragpulse")
    assert np.array_equal(fast.doc_ids, own.doc_ids)
    assert fast.session_id.to_pylist() == own.session_id.to_pylist()
    assert (fast.n_requests - 1) / fast.arrival_s[-1] == pytest.approx(2.0, rel=0.05)


# --------------------------------------------------------------------------- bad input
def _copy_sample(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    shutil.copytree(SAMPLE, folder)
    return folder


def _edit_line(path: Path, line: int, change) -> None:
    lines = path.read_text().split("\n")
    lines[line - 1] = change(lines[line - 1])
    path.write_text("\n".join(lines))


def _edit_json(path: Path, line: int, change) -> None:
    def edit(text: str) -> str:
        row = json.loads(text)
        change(row)
        return json.dumps(row)
    _edit_line(path, line, edit)


TRACE = "0_trace.jsonl"
BAD_CASES = [
    # (file, line, field, how the line is broken)
    (TRACE, 3, None, lambda f: _edit_line(f, 3, lambda s: s[:-5])),  # not JSON
    (TRACE, 3, "timestamp", lambda f: _edit_json(f, 3, lambda r: r.pop("timestamp"))),
    (TRACE, 3, "timestamp", lambda f: _edit_json(f, 3, lambda r: r.update(timestamp="soon"))),
    (TRACE, 3, "input_length", lambda f: _edit_json(f, 3, lambda r: r.pop("input_length"))),
    (TRACE, 3, "input_length", lambda f: _edit_json(f, 3, lambda r: r.update(input_length=9))),
    (TRACE, 3, "output_length", lambda f: _edit_json(f, 3, lambda r: r.update(
        output_length="77"))),
    (TRACE, 3, "session_id", lambda f: _edit_json(f, 3, lambda r: r.pop("session_id"))),
    (TRACE, 3, "hash_ids", lambda f: _edit_json(f, 3, lambda r: r.pop("hash_ids"))),
    (TRACE, 3, "hash_ids.passages_ids", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"].pop("passages_ids"))),
    # an id with no length, in each length file's space
    (TRACE, 3, "hash_ids.passages_ids", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"]["passages_ids"].append(99999))),
    (TRACE, 3, "hash_ids.sys_prompt", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"]["sys_prompt"].append(7398))),  # a passage's id
    (TRACE, 3, "hash_ids.history", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"]["history"].append(1))),
    (TRACE, 3, "hash_ids.user_input", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"].update(user_input=["x"]))),
    (TRACE, 3, "hash_ids", lambda f: _edit_json(
        f, 3, lambda r: r["hash_ids"].update(sys_prompt=[], passages_ids=[]))),
    # a week-long block that runs past its week (the weekly clock cannot place it)
    (TRACE, 3, "timestamp", lambda f: _edit_json(f, 3, lambda r: r.update(
        timestamp=str(WEEK_S)))),
    ("2_passages.jsonl", 2, "token_length", lambda f: _edit_json(
        f, 2, lambda r: r.pop("token_length"))),
    ("2_passages.jsonl", 2, "token_length", lambda f: _edit_json(
        f, 2, lambda r: r.update(token_length=0))),
    ("2_passages.jsonl", 2, "passage_id", lambda f: _edit_line(
        f, 2, lambda s: (f.read_text().split("\n")[0]))),  # an id listed twice
    ("1_sys_prompt.jsonl", 4, "sys_prompt_id", lambda f: _edit_json(
        f, 4, lambda r: r.update(sys_prompt_id=-1))),
]


@pytest.mark.parametrize("name,line,field,breaks", BAD_CASES)
def test_bad_input_ends_in_one_line_naming_file_line_and_field(tmp_path, name, line, field,
                                                               breaks):
    folder = _copy_sample(tmp_path)
    breaks(folder / name)
    with pytest.raises(TraceError) as info:
        read_ragpulse(folder)
    assert (info.value.file, info.value.row, info.value.field) == (str(folder / name), line,
                                                                   field)
    out = tmp_path / "out"
    result = runner.invoke(app, ["trace", "import-ragpulse", str(folder), str(out)])
    assert result.exit_code == 2
    message = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(message) == 1 and message[0].startswith("error: "), result.stderr
    assert str(folder / name) in message[0] and f"row {line}" in message[0]
    if field is not None:
        assert f"'{field}'" in message[0]
    assert not out.exists()  # nothing written, not even the folder


def test_a_missing_file_or_folder_is_named(tmp_path):
    folder = _copy_sample(tmp_path)
    (folder / "3_history.jsonl").unlink()
    with pytest.raises(TraceError, match=r"missing 3_history\.jsonl") as info:
        read_ragpulse(folder)
    assert info.value.file == str(folder)
    with pytest.raises(TraceError, match="not a folder"):
        read_ragpulse(tmp_path / "nowhere")


def test_compressed_files_read_as_the_plain_ones(tmp_path):
    folder = _copy_sample(tmp_path)
    for path in folder.glob("*.jsonl"):
        (path.parent / f"{path.name}.xz").write_bytes(lzma.compress(path.read_bytes()))
        path.unlink()
    a, b = read_ragpulse(SAMPLE), read_ragpulse(folder)
    assert np.array_equal(a.doc_ids, b.doc_ids) and np.array_equal(a.arrival_s, b.arrival_s)


GOOD_LINE = {"timestamp": "5", "input_length": 600, "output_length": 3,
             "hash_ids": {"sys_prompt": [8302], "passages_ids": [7398], "history": [15200],
                          "web_search": [], "user_input": [26923]},
             "session_id": "s"}


@st.composite
def broken_lines(draw) -> list[dict]:
    rows = [json.loads(json.dumps(GOOD_LINE)) for _ in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 3))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        target = row if draw(st.booleans()) else row.get("hash_ids")
        if not isinstance(target, dict) or not target:
            target = row
        key = draw(st.sampled_from(sorted(target) or ["timestamp"]))
        action = draw(st.sampled_from(["junk", "drop", "junk-in-list"]))
        if action == "drop":
            target.pop(key, None)
        elif action == "junk-in-list" and isinstance(target.get(key), list):
            target[key] = [*target[key], draw(SCALARS)]
        else:
            target[key] = draw(JUNK)
    return rows


@FUZZ
@given(rows=broken_lines())
def test_broken_ragpulse_lines_fail_cleanly(rows):
    folder = _workdir()
    for name in LENGTH_FILES.values():
        shutil.copy(SAMPLE / name[0], folder / name[0])
    (folder / TRACE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_clean(lambda: read_ragpulse(folder), folder)


def test_trace_stats_prints_the_measurements_worked_out_from_the_raw_lines():
    result = runner.invoke(app, ["trace", "stats", "ragpulse", "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    rows = raw_requests(packaged_trace_dir("ragpulse"))
    # skew over the passages: each one's references, most referenced first; the top x% is the
    # ceil(x * n) most referenced of the n passages referenced at least once
    refs = {}
    for r in rows:
        for kind, segment in r.path:
            if kind == "passage":
                refs[segment] = refs.get(segment, 0) + 1
    counts = sorted(refs.values(), reverse=True)
    for pct in (1, 3, 10):
        top = -(-len(counts) * pct // 100)
        assert s[f"top_{pct}pct_share"] == pytest.approx(sum(counts[:top]) / sum(counts))
    assert s["unique_documents_retrieved"] == len(counts)
    # reuse: the path's prefix at unlimited memory, and every segment listed before anywhere
    path_tokens = sum(sum(r.path_tokens) for r in rows)
    assert s["prefix_reuse_share"] == pytest.approx(sum(hits_by_prefix_set(rows)) / path_tokens)
    seen, free, free_passage, passage_tokens = set(), 0, 0, 0
    for r in rows:
        for key, tokens in zip(r.path, r.path_tokens, strict=True):
            passage_tokens += tokens if key[0] == "passage" else 0
            if key in seen:
                free += tokens
                free_passage += tokens if key[0] == "passage" else 0
        seen.update(r.path)
    assert s["order_free_reuse_share"] == pytest.approx(free / path_tokens)
    assert s["order_free_reuse_passage_share"] == pytest.approx(free_passage / passage_tokens)
    assert s["sessions"] == 3990 and s["requests"] == 7106
    assert s["system_prompt_distinct_by_position"] == [3, 1415, 5480]
    assert sum(s["requests_by_day"]) == 7106 and len(s["requests_by_day"]) == 15
    assert s["top10_turnover_corrected"] is not None


@pytest.mark.parametrize("command", ["replay", "run"])
def test_a_second_system_prompt_is_counted_and_said_so(command):
    """RAGPulse's paths carry their own prompt; --system-prompt-tokens adds a shared root on
    top (counted: it is what the flag says), and the summary warns of it."""
    def warnings(*extra):
        result = runner.invoke(app, [command, "--trace", "ragpulse", "--requests", "30",
                                     "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["warnings"]

    assert not any("system-prompt" in w for w in warnings())
    assert any("system-prompt segments" in w and "100 tokens" in w
               for w in warnings("--system-prompt-tokens", "100"))


def test_the_import_never_writes_into_the_published_files_or_over_a_trace(tmp_path):
    """The published folder is an input: a trace written into it would sit beside (and a
    later one over) files ragsim did not write; an earlier trace needs --force."""
    import shutil

    source = tmp_path / "published"
    shutil.copytree(SAMPLE, source)
    before = sorted(p.name for p in source.iterdir())
    into_source = runner.invoke(app, ["trace", "import-ragpulse", str(source), str(source)])
    assert into_source.exit_code == 2 and "an input" in into_source.stderr
    assert sorted(p.name for p in source.iterdir()) == before
    out = tmp_path / "trace"
    assert runner.invoke(app, ["trace", "import-ragpulse", str(source), str(out)]).exit_code == 0
    again = runner.invoke(app, ["trace", "import-ragpulse", str(source), str(out)])
    assert again.exit_code == 2 and "--force" in again.stderr
    forced = runner.invoke(app, ["trace", "import-ragpulse", str(source), str(out), "--force"])
    assert forced.exit_code == 0, forced.output
