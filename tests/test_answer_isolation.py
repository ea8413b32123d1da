"""A user's Redis is theirs: ragsim keeps to a namespace of its own, deletes only its own keys,
and never prints, raises or writes the server's password. On the real server (embedded valkey
+ RediSearch), through the commands a user runs.

- A server holding the user's own keys (strings, hashes, a list, a set, keys with TTLs, keys
  named like ragsim's old ones, another vector index with its documents): after every command
  that writes to it, each key is byte-for-byte what it was (``DUMP``), with its TTL, and the
  user's index holds its documents; nothing of ragsim's is left behind.
- Two runs on one server: each one's tiers and answers are what they are alone (a run started
  in the middle of another, and a whole ``answers golden`` run in between, change nothing).
- A password-protected server: no output, error, log line or written file of any command
  holds the password.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, exact_key
from ragsim.cli import app
from ragsim.realrun.answers import EmbeddedServer, RedisSharedStore, VectorIndex, connect
from ragsim.redact import redact, redact_url

GOLDEN = Path(__file__).parent / "data" / "answer_golden_gsm8k.jsonl"
PROFILE = "cpu-mistral-7b-l2-h256"
PASSWORD = "Zq7-not.a-real-Pw9"


def user_keys(client) -> None:
    """What a user's Redis might hold, some of it named like ragsim's old keys."""
    client.set("session:42", b"\x00\xffbinary value")
    client.set("exact:0123456789abcdef0123456789abcdef", '{"mine": true}')  # ragsim's old name
    client.set("with-ttl", "expires later", ex=86_400)
    client.hset("user:1", mapping={"name": "Ann", "plan": "pro"})
    client.rpush("queue", "a", "b", "c")
    client.sadd("tags", "x", "y")
    client.hset("ragsim-answers:old", mapping={"prompt": "kept"})  # the old index's prefix
    client.execute_command("FT.CREATE", "user-idx", "ON", "HASH", "PREFIX", "1", "doc:",
                           "SCHEMA", "title", "TEXT", "vec", "VECTOR", "FLAT", "6", "TYPE",
                           "FLOAT32", "DIM", "4", "DISTANCE_METRIC", "COSINE")
    for i in range(5):
        client.hset(f"doc:{i}", mapping={"title": f"doc {i}",
                                         "vec": np.full(4, i + 1, np.float32).tobytes()})


def snapshot(client) -> dict:
    """Every key's serialized value (DUMP: byte for byte) and whether it has a TTL."""
    return {key: (client.dump(key), client.pttl(key) > 0) for key in client.scan_iter()}


def user_index_docs(client) -> int:
    return int(client.ft("user-idx").info()["num_docs"])


@pytest.fixture(scope="module")
def small_run_trace(tmp_path_factory):
    """A 12-request trace with GSM8K questions (some repeated), on disk for `run --trace`."""
    from ragsim.serving.answer_stage import embed_texts
    from ragsim.traces.io import write_trace
    from ragsim.traces.paraphrase import with_questions
    from tests.test_realrun_harness import small_trace

    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()][:4]
    built = with_questions(small_trace(12), [r["question"] for r in rows],
                           [f"gsm8k-{i}" for i in range(4)], zipf_s=1.1, paraphrase_p=0.0,
                           seed=2, n_requests=12)
    built = dataclasses.replace(built, query_embedding=embed_texts(built.query_text.to_pylist()))
    path = tmp_path_factory.mktemp("trace") / "t"
    write_trace(built, path)
    return path


def golden_file(tmp_path: Path, n: int = 6) -> Path:
    path = tmp_path / "golden.jsonl"
    path.write_text("\n".join(GOLDEN.read_text().splitlines()[:n]) + "\n")
    return path


def commands(url: str, tmp_path: Path, trace: Path) -> dict[str, list[str]]:
    """Every command that writes to the Redis it is given."""
    questions = str(golden_file(tmp_path))
    return {
        "golden": ["answers", "golden", "--questions", questions, "--redis-url", url],
        "golden --json": ["answers", "golden", "--questions", questions, "--redis-url", url,
                          "--json"],
        "bench": ["answers", "bench", "--entries", "60", "--samples", "5", "--redis-url", url,
                  "--algorithm", "flat"],
        "bench --json": ["answers", "bench", "--entries", "60", "--samples", "5",
                         "--redis-url", url, "--json"],
        "profile --answer-cache": ["profile", "--answer-cache", "--redis-url", url,
                                   "--answer-entries", "30", "--answer-samples", "3",
                                   "--out", str(tmp_path / "answer-profile.json")],
        "run --backend torch": ["run", "--trace", str(trace), "--answer-cache", "--profile",
                                PROFILE, "--backend", "torch", "--arrival", "sequential",
                                "--redis-url", url, "--out", str(tmp_path / "run"), "--json"],
    }


def test_a_users_keys_survive_every_command_byte_for_byte(small_run_trace, tmp_path):
    with EmbeddedServer() as server:
        client = connect(server.url, timeout_s=5.0)
        user_keys(client)
        before = snapshot(client)
        assert user_index_docs(client) == 5
        runner = CliRunner()
        for name, args in commands(server.url, tmp_path, small_run_trace).items():
            res = runner.invoke(app, args)
            assert res.exit_code == 0, (name, res.output)
            assert snapshot(client) == before, name  # nothing of ragsim's left, nothing lost
            assert user_index_docs(client) == 5, name
            assert client.execute_command("FT._LIST") == [b"user-idx"], name
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        namespace = summary["answer_cache_server"]["namespace"]
        assert namespace.startswith("run-")
        assert summary["answer_cache_server"]["namespace_keys_at_start"] == 0  # a cold start
        assert sum(summary["answer_cache_hits"].values()) > 0  # the run did use the server


def test_a_named_namespace_is_kept_shared_and_cleared_alone(small_run_trace, tmp_path):
    """`run --answer-namespace` keeps its entries: the next run of that name starts warm;
    `answers clear` empties that namespace only."""
    with EmbeddedServer() as server:
        client = connect(server.url, timeout_s=5.0)
        user_keys(client)
        before = snapshot(client)
        runner = CliRunner()
        results = []
        for k in range(2):
            out = tmp_path / f"run{k}"
            res = runner.invoke(app, ["run", "--trace", str(small_run_trace), "--answer-cache",
                                      "--profile", PROFILE, "--backend", "torch", "--arrival",
                                      "sequential", "--redis-url", server.url,
                                      "--answer-namespace", "shared-1", "--out", str(out)])
            assert res.exit_code == 0, res.output
            results.append(json.loads((out / "summary.json").read_text()))
        first, second = results
        assert first["answer_cache_server"]["namespace_keys_at_start"] == 0
        kept = second["answer_cache_server"]["namespace_keys_at_start"]
        assert kept > 0  # the first run's entries, found by the second
        # warm: the second run's first asks of each question hit L2 instead of missing
        assert second["answer_cache_misses"] == 0 < first["answer_cache_misses"]
        assert first["config"]["answer_namespace"] == "shared-1"
        ours = {k for k in client.scan_iter() if k not in before}
        assert ours and all(k.startswith(b"ragsim:shared-1:") for k in ours)
        assert b"ragsim:shared-1:semantic" in client.execute_command("FT._LIST")
        res = runner.invoke(app, ["answers", "clear", "--redis-url", server.url,
                                  "--namespace", "shared-1"])
        assert res.exit_code == 0, res.output
        assert f"{len(ours)} keys deleted" in res.output
        assert snapshot(client) == before
        assert client.execute_command("FT._LIST") == [b"user-idx"]
        assert user_index_docs(client) == 5


@pytest.mark.parametrize("name", ["a:b", "x*", "", "sp ace", "n" * 65])
def test_a_bad_namespace_is_refused_naming_the_flag(name):
    res = CliRunner().invoke(app, ["run", "--answer-cache", "--answer-namespace", name,
                                   "--requests", "5"])
    assert res.exit_code == 2
    assert "answer-namespace" in res.output or "answer_namespace" in res.output


def workload(n: int, questions: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, questions + 1)
    return [int(q) for q in rng.choice(questions, size=n, p=weights / weights.sum())]


class Run:
    """One run's answer cache on a server: its questions, its own answers ("run X's answer"),
    each request's tier and the answer it got."""

    def __init__(self, url: str, name: str, asked: list[int], vecs: np.ndarray) -> None:
        self.name, self.asked, self.vecs = name, asked, vecs
        store = RedisSharedStore(url, dims=vecs.shape[1], distance_threshold=0.05,
                                 index=VectorIndex(algorithm="flat"))
        # L1 expires at once: every repeat reaches Redis (L2), where runs could meet
        self.cache = AnswerCache(AnswerCacheConfig(l1_ttl_s=1e-6, ttl_jitter=0.0,
                                                   distance_threshold=0.05), store)
        self.store = store
        self.tiers: list[str] = []
        self.served: list[str] = []

    def step(self, i: int) -> None:
        q = self.asked[i]
        question, answer = f"question {q}", f"{self.name}'s answer {q}"
        got = self.cache.lookup(question, time.time(), embedding=self.vecs[q])
        if not got.hit:
            self.cache.write_back(question, answer, time.time(), embedding=self.vecs[q])
        self.tiers.append(got.tier)
        self.served.append(got.entry.answer if got.hit else answer)


def test_two_runs_on_one_server_see_only_their_own_entries(tmp_path):
    """Run A alone, then A again with run B (the same questions, other answers) started in the
    middle of it, their requests interleaved, and a whole `answers golden` run in between:
    A's L2 hits, tiers and answers are unchanged, B's are B's alone, and nothing is served
    across runs."""
    vecs = np.random.default_rng(0).normal(size=(30, 16)).astype(np.float32)
    asked_a, asked_b = workload(300, 30, 1), workload(300, 30, 2)
    with EmbeddedServer() as server:
        alone_a = Run(server.url, "A", asked_a, vecs)
        for i in range(300):
            alone_a.step(i)
        alone_b = Run(server.url, "B", asked_b, vecs)
        for i in range(300):
            alone_b.step(i)
        a, b = Run(server.url, "A", asked_a, vecs), None
        for i in range(300):
            a.step(i)
            if i == 100:  # B starts while A runs (it once flushed the database here)
                b = Run(server.url, "B", asked_b, vecs)
            if i == 150:  # a whole other command on the same server
                res = CliRunner().invoke(app, ["answers", "golden", "--questions",
                                               str(golden_file(tmp_path)), "--redis-url",
                                               server.url, "--json"])
                assert res.exit_code == 0, res.output
                assert json.loads(res.stdout)["first_pass_hit_rate"] == 0.0  # cold
            if b is not None:
                b.step(len(b.tiers))
        while len(b.tiers) < 300:
            b.step(len(b.tiers))
    assert alone_a.tiers.count("l2") > 200  # the measure: L2 hits (the 30 -> 17)
    assert a.tiers == alone_a.tiers and a.served == alone_a.served
    assert b.tiers == alone_b.tiers and b.served == alone_b.served
    assert all(s.startswith("A's") for s in a.served)
    assert all(s.startswith("B's") for s in b.served)
    assert a.store.namespace != b.store.namespace


def test_a_store_deletes_only_its_own_namespace():
    with EmbeddedServer() as server:
        client = connect(server.url, timeout_s=5.0)
        user_keys(client)
        before = snapshot(client)
        vec = np.ones(4, dtype=np.float32)
        stores = [RedisSharedStore(server.url, dims=4, distance_threshold=0.1,
                                   index=VectorIndex(algorithm="flat"), namespace=name)
                  for name in ("one", "one-two")]  # one's prefix is not a prefix of the other
        for store in stores:
            cache = AnswerCache(AnswerCacheConfig(), store)
            cache.write_back("q", f"answer of {store.namespace}", time.time(), embedding=vec)
        stores[0].clear()
        assert stores[0].own_keys() == []
        assert stores[1].get_exact(exact_key("q"), time.time()).answer == "answer of one-two"
        assert stores[1].nearest(vec, time.time())[0].answer == "answer of one-two"
        stores[1].clear()
        assert snapshot(client) == before
        assert client.execute_command("FT._LIST") == [b"user-idx"]


# -- passwords ---------------------------------------------------------------------------------
def test_redact_url_and_text():
    assert redact_url("redis://user:pw@host:6380/0") == "redis://user:***@host:6380/0"
    assert redact_url("redis://:p%40ss@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("redis://lone@h/0") == "redis://***@h/0"  # some clients: a password
    assert redact_url("redis://:a/b@c@h:1/0") == "redis://:***@h:1/0"  # unencoded / and @
    assert redact_url("redis://h:1/0?password=x1&db=2") == "redis://h:1/0?password=***&db=2"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    text = "cannot parse 'p@ss@h:1' nor p%40ss in redis://:p%40ss@h:1/0"
    assert redact(text, "redis://:p%40ss@h:1/0") == \
        "cannot parse '***@h:1' nor *** in redis://:***@h:1/0"


def written_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_no_output_error_log_or_file_holds_the_password(small_run_trace, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    runner = CliRunner()
    seen: dict[str, str] = {}
    with EmbeddedServer(password=PASSWORD) as server:
        assert PASSWORD in server.url
        work = tmp_path / "work"
        work.mkdir()
        for name, args in commands(server.url, work, small_run_trace).items():
            res = runner.invoke(app, args)
            assert res.exit_code == 0, (name, res.output.replace(PASSWORD, "<pw>"))
            seen[name] = res.output
        assert "user Redis at redis://:***@127.0.0.1" in seen["golden --json"]
        port = server.port
        bad = {  # errors: a wrong password, nothing listening, a URL that does not parse
            "wrong password": f"redis://:{PASSWORD}x@127.0.0.1:{port}/0",
            "nothing there": f"redis://user:{PASSWORD}@127.0.0.1:1/0",
            "malformed": f"redis://:{PASSWORD}/x@127.0.0.1:notaport/0",
        }
        for what, url in bad.items():
            for args in (["answers", "golden", "--questions", str(golden_file(tmp_path)),
                          "--redis-url", url, "--json"],
                         ["answers", "bench", "--redis-url", url],
                         ["answers", "clear", "--redis-url", url, "--namespace", "n"],
                         ["run", "--trace", str(small_run_trace), "--answer-cache",
                          "--profile", PROFILE, "--backend", "torch", "--redis-url", url]):
                res = runner.invoke(app, args)
                assert res.exit_code == 2, (what, args[:2], res.output.replace(PASSWORD, "<pw>"))
                assert "--redis-url" in res.output
                seen[f"{what}: {args[:2]}"] = res.output
    for name, output in seen.items():
        assert PASSWORD not in output, name
        assert PASSWORD.split("-")[1] not in output, name  # nor a piece of it
    assert PASSWORD not in caplog.text
    files = written_files(work)
    assert {p.name for p in files} >= {"answer-profile.json", "summary.json", "config.toml",
                                       "requests.parquet"}
    for path in files:
        assert PASSWORD.encode() not in path.read_bytes(), path
    profile = json.loads((work / "answer-profile.json").read_text())
    assert profile["measured"]["server"] == f"user Redis at redis://:***@127.0.0.1:{port}/0"
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["config"]["answer_redis_url"] == f"redis://:***@127.0.0.1:{port}/0"
