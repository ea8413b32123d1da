"""The padded decode batch: the torch engine lays out its decode steps by one rule
(``profiles.decode_layout.PaddedDecodeBatch``), the simulator prices a profile of that engine
by the same rule, and both put a step's rows where the batch's tensors put them.

Expected ends are worked out by hand from the rule as the engine's docstrings state it: a
batch is rebuilt (its end reset to its longest row) for its first step, for a joiner longer
than the common end, for more rows than the buffer holds, when no row of the last step stays
and when its end is more than twice its longest row; otherwise it changes in place and keeps
its end; every step adds a token."""

from __future__ import annotations

import dataclasses

import pytest

from ragsim.decisions import priced_s
from ragsim.errors import ProfileError
from ragsim.profiles.decode_layout import PaddedDecodeBatch, decode_buffer_shape, grown_tokens
from ragsim.profiles.profile import Profile, load_profile
from ragsim.realrun.harness import RealRun
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

PROFILE = "cpu-mistral-7b-l2-h256"  # measured on the torch engine
SYSTEM_PROMPT_TOKENS = 24


def test_a_batch_keeps_its_end_until_a_rebuild_resets_it():
    lengths = {"a": 100, "b": 80, "c": 60, "d": 150, "e": 30, "f": 20}
    batch = PaddedDecodeBatch()
    assert batch.plan({"a", "b"}, lengths.get)  # the first batch: built
    assert (batch.end_tokens, batch.buffer_rows, batch.buffer_tokens) == (100, 6, 164)
    batch.advance()                       # a: 101, b: 81, end 101
    assert not batch.plan({"a", "b"}, lengths.get) and batch.end_tokens == 101
    batch.advance(3)                      # a: 104, b: 84, end 104
    assert not batch.plan({"b", "c"}, lengths.get)  # a left, c (60 <= 104) joins in place
    assert batch.end_tokens == 104        # the end a left behind (104 <= 2 x 84)
    batch.advance()                       # b: 85, c: 61, end 105
    assert batch.plan({"b", "c", "d"}, lengths.get)  # d (150 > 105) joins: rebuilt
    assert batch.end_tokens == 150        # the longest row's
    assert (batch.buffer_rows, batch.buffer_tokens) == (7, 214)
    batch.advance()                       # b: 86, c: 62, d: 151, end 151
    assert batch.plan({"c", "e"}, lengths.get)  # b, d left: 151 > 2 x 62, rebuilt
    assert batch.end_tokens == 62
    batch.advance()                       # c: 63, e: 31, end 63
    assert not batch.plan({"c"}, lengths.get) and batch.end_tokens == 63
    batch.advance()                       # c: 64, end 64
    assert batch.plan({"f"}, lengths.get)  # no row stays: rebuilt around the joiner
    assert batch.end_tokens == 20


def test_more_rows_than_the_buffer_holds_rebuild_at_the_longest_row():
    batch = PaddedDecodeBatch()
    batch.plan(range(4), lambda r: 10 + r)           # 4 rows: 4 + 4 of room
    assert (batch.end_tokens, batch.buffer_rows) == (13, 8)
    batch.advance()                                   # rows 11..14, end 14
    assert not batch.plan(range(8), lambda r: 5)      # 8 rows fit: in place
    assert batch.end_tokens == 14
    batch.advance()                                   # rows 0-3: 12..15; 4-7: 6; end 15
    assert batch.plan(range(9), lambda r: 5)          # a ninth row: rebuilt
    assert batch.end_tokens == 15                     # row 3 (13 + 2)
    assert batch.buffer_rows == 9 + 4


def test_a_full_buffer_grows_and_keeps_only_its_rows():
    batch = PaddedDecodeBatch()
    batch.plan({"a"}, lambda _: 100)
    rows, tokens = decode_buffer_shape(1, 100)
    assert (rows, tokens) == (5, 164)
    batch.advance(64)                     # end 164: still fits
    assert (batch.buffer_rows, batch.buffer_tokens) == (5, 164)
    batch.advance()                       # end 165: grows as GrowingLayer does, to 1 row
    assert (batch.buffer_rows, batch.buffer_tokens) == (1, grown_tokens(164))
    assert grown_tokens(164) == 164 + 41 + 64
    assert batch.plan({"a", "b"}, lambda _: 10)  # so a second row rebuilds
    batch.reset()
    assert batch.plan({"b"}, lambda _: 10) and batch.end_tokens == 10


def two_requests(gap_s: float):
    """Request 0: 24 + 60 + 10 = 94 prompt tokens, 2 output tokens (one decode step); request
    1: 24 + 29 + 5 = 58, 3 output tokens (two decode steps), ``gap_s`` later."""
    b = TraceBuilder("padded-decode")
    b.add(0, 0.0, 10, 2, [5], [60])
    b.add(1, gap_s, 5, 3, [2], [29])
    return b.build({"name": "padded-decode"})


def config(arrival: str):
    return build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                         "arrival": arrival, "speculate": False, "search_s": 0.001,
                         "system_prompt_tokens": SYSTEM_PROMPT_TOKENS})


def real_decodes(arrival: str) -> list[dict]:
    run = RealRun(two_requests(0.0), config(arrival), load_profile(PROFILE))
    run.result = run.run()
    assert (run.result.columns["status"] == "completed").all()
    decodes = [d for d in run.iterations.decisions if d["kind"] == "decode"]
    logged = [entry[-1] for entry in run.iterations.log if entry[0] == "decode"]
    assert logged == [d["padded_context_tokens"] for d in decodes]
    return decodes


# the serving engine's context frame counts the token a step decodes: a row of a 94-token
# prompt is at 95 in its first decode step; the engine reads its batch's end from the batch's
# cache, in that frame, and checks it against its layout at every step


def test_a_short_request_decodes_at_the_end_a_long_one_left():
    """Both arrive at once and decode together; the long one leaves after one step and the
    short one's second step runs in place, at the long one's end (96 <= 2 x 60)."""
    decodes = real_decodes("trace")
    assert [(d["size"], d["context_tokens"]) for d in decodes] == [(2, (95 + 59) / 2),
                                                                   (1, 60)]
    assert [d["padded_context_tokens"] for d in decodes] == [95, 96]
    # what each step wrote into its batch (KV frame: the prompts' 94 and 58 tokens): the
    # first built both rows to 94; the second moved the short row into the long one's, to 95
    assert [(d.get("batch_change"), d.get("batch_rows"), d.get("batch_row_tokens"))
            for d in decodes] == [("rebuild", 2, 2 * 94), ("reshape", 1, 1 * 95)]
    assert all(0 < d["batch_copy_s"] < d["end_s"] - d["start_s"] for d in decodes)


def test_a_batch_that_emptied_is_rebuilt_around_its_joiner():
    """One at a time: the short request joins a batch no row of which stays, so it is rebuilt
    at its own length."""
    decodes = real_decodes("sequential")
    assert [d["context_tokens"] for d in decodes] == [95, 59, 60]
    assert [d["padded_context_tokens"] for d in decodes] == [95, 59, 60]
    # each first step builds its own row; the short one's second step changes nothing
    assert [(d.get("batch_change"), d.get("batch_rows"), d.get("batch_row_tokens"))
            for d in decodes] == [("rebuild", 1, 94), ("rebuild", 1, 58), (None, None, None)]
    assert "batch_copy_s" not in decodes[2]


def linear_decode(padding: str) -> Profile:
    """The shipped torch profile with a decode step of 1 ms + 10 us a context token at every
    batch size, and no terms beside the grid (so a step's price is worked out by hand)."""
    data = load_profile(PROFILE).to_dict()
    contexts = data["decode"]["context_tokens"]
    data["decode"]["seconds"] = [[1e-3 + 1e-5 * c for c in contexts]
                                 for _ in data["decode"]["batch_sizes"]]
    for key in ("step_overhead", "new_shapes", "idle_start", "decode_after_prompt", "batch_copy"):
        data.pop(key, None)
    data["decode_padding"] = padding
    return Profile.from_dict(data, source="test")


@pytest.mark.parametrize(("padding", "contexts"), [("common_end", (95, 96)),
                                                   ("none", ((95 + 59) / 2, 60))])
def test_the_simulator_prices_a_padded_batch_at_its_end(padding, contexts):
    """The short request's two decode steps (the first beside the long one), as the engine
    ran them above, at 1 ms + 10 us a context token."""
    result = run_simulation(two_requests(0.0), config("trace"), linear_decode(padding))
    columns = result.columns
    decode_s = columns["finish_s"][1] - columns["first_token_s"][1]
    assert decode_s == pytest.approx(sum(1e-3 + 1e-5 * c for c in contexts), rel=1e-9)


def test_a_replayed_decode_step_is_priced_where_its_profile_says():
    step = {"kind": "decode", "size": 1, "context_tokens": 43.0, "padded_context_tokens": 96}
    assert priced_s(step, linear_decode("common_end")) == pytest.approx(1e-3 + 1e-5 * 96)
    assert priced_s(step, linear_decode("none")) == pytest.approx(1e-3 + 1e-5 * 43)


def test_decode_padding_is_saved_and_checked(tmp_path):
    padded = linear_decode("common_end")
    assert Profile.from_dict(padded.to_dict()).decode_padding == "common_end"
    assert "decode_padding" not in linear_decode("none").to_dict()
    assert dataclasses.replace(padded, decode_padding="none").decode_padding == "none"
    with pytest.raises(ProfileError, match="decode_padding"):
        Profile.from_dict({**padded.to_dict(), "decode_padding": "right"}, source="p.json")
