"""A changed padded decode batch's write (``profiles/batch_copy.py``): the term, the rows the
layout says a change writes, and what the simulator and the replay charge for it, each worked
out by hand."""

from __future__ import annotations

import pytest

from ragsim.decisions import priced_s
from ragsim.errors import ProfileError
from ragsim.profiles.batch_copy import BatchCopy, batch_copy_from_dict, fit_batch_copy
from ragsim.profiles.decode_layout import PaddedDecodeBatch
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.profiler import batch_copy_cells
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

PROFILE = "cpu-mistral-7b-l2-h256"
SYSTEM_PROMPT_TOKENS = 24


def test_a_write_costs_its_latency_its_rows_and_their_tokens():
    term = BatchCopy(latency_s=5e-4, s_per_row=1e-5, s_per_row_token=2e-7)
    assert term.seconds(0, 0) == 0.0  # nothing written, nothing paid (not even the latency)
    assert term.seconds(1, 1_000) == pytest.approx(5e-4 + 1e-5 + 2e-4)
    assert term.seconds(64, 64 * 2_048) == pytest.approx(5e-4 + 64e-5 + 64 * 2_048 * 2e-7)


def test_the_fit_finds_a_line_the_timings_lie_on():
    """Timings made from 0.7 ms + 30 us a row + 250 ns a row-token at the profiler's cells,
    three repeats each: the fit gives the three numbers back, and its errors are nil."""
    rows = [[r, t, 7e-4 + r * 3e-5 + r * t * 2.5e-7] for r in (1, 4, 16)
            for t in (128, 2_048) for _ in range(3)]
    term = fit_batch_copy(rows)
    assert term.latency_s == pytest.approx(7e-4, rel=1e-9)
    assert term.s_per_row == pytest.approx(3e-5, rel=1e-9)
    assert term.s_per_row_token == pytest.approx(2.5e-7, rel=1e-9)
    assert term.fit["max_abs_rel_error"] == pytest.approx(0.0, abs=1e-9)
    assert len(term.fit["timings"]) == 18


def test_a_fit_never_goes_negative():
    """Timings that fall with size (noise on a flat cost) give rates of 0, not negative ones:
    a bigger write is never priced cheaper."""
    term = fit_batch_copy([[1, 128, 2e-3], [16, 2_048, 1e-3], [4, 512, 1.5e-3]])
    assert term.s_per_row == 0.0 and term.s_per_row_token == 0.0 and term.latency_s > 0


def test_a_bad_term_names_its_field():
    good = BatchCopy(1e-4, 1e-5, 1e-7).to_dict()
    assert batch_copy_from_dict(good, source="p.json") == BatchCopy(1e-4, 1e-5, 1e-7)
    with pytest.raises(ProfileError, match=r"batch_copy\.s_per_row\b"):
        batch_copy_from_dict({k: v for k, v in good.items() if k != "s_per_row"},
                             source="p.json")
    with pytest.raises(ProfileError, match=r"batch_copy\.s_per_row_token"):
        batch_copy_from_dict({**good, "s_per_row_token": -1.0}, source="p.json")
    with pytest.raises(ProfileError, match=r"batch_copy\.latency_s"):
        batch_copy_from_dict({**good, "latency_s": "fast"}, source="p.json")
    with pytest.raises(ProfileError, match=r"batch_copy\.model"):
        batch_copy_from_dict({**good, "model": "other"}, source="p.json")


def test_the_profile_keeps_the_term_through_its_file(tmp_path):
    data = load_profile(PROFILE).to_dict()
    data["batch_copy"] = BatchCopy(3e-4, 1e-5, 2e-7, {"note": "by hand"}).to_dict()
    saved = Profile.from_dict(data, source="test").save(tmp_path / "p.json")
    again = load_profile(str(saved))
    assert again.batch_copy == BatchCopy(3e-4, 1e-5, 2e-7, {"note": "by hand"})
    assert again.batch_copy_s(2, 100) == pytest.approx(3e-4 + 2e-5 + 2e-5)
    without = {k: v for k, v in data.items() if k != "batch_copy"}
    assert Profile.from_dict(without, source="test").batch_copy_s(2, 100) == 0.0  # no term


def test_the_layout_counts_what_each_change_writes():
    """Rows a, b of 10 and 20 tokens: built (2 x 20); unchanged (0); a leaves (a change in
    place: the row moved into its hole, 1 x the end 21); c of 5 joins (1 x 22); d of 50 joins,
    longer than the end (rebuilt: 3 rows x 50)."""
    batch = PaddedDecodeBatch()
    tokens = {"a": 10, "b": 20, "c": 5, "d": 50}
    def written():
        return batch.written_rows, batch.written_row_tokens

    assert batch.plan({"a", "b"}, tokens.get) and written() == (2, 2 * 20)
    batch.advance()
    assert not batch.plan({"a", "b"}, tokens.get) and written() == (0, 0)
    assert not batch.plan({"b"}, tokens.get) and written() == (1, 1 * 21)
    batch.advance()
    assert not batch.plan({"b", "c"}, tokens.get) and written() == (1, 1 * 22)
    batch.advance()
    assert batch.plan({"b", "c", "d"}, tokens.get) and written() == (3, 3 * 50)


def linear_decode_with_copy() -> Profile:
    """The shipped torch profile with a decode step of 1 ms + 10 us a context token, a write
    of 0.5 ms + 0.1 ms a row + 1 us a row-token, and no other terms (prices worked out by
    hand)."""
    data = load_profile(PROFILE).to_dict()
    contexts = data["decode"]["context_tokens"]
    data["decode"]["seconds"] = [[1e-3 + 1e-5 * c for c in contexts]
                                 for _ in data["decode"]["batch_sizes"]]
    for key in ("step_overhead", "new_shapes", "idle_start", "decode_after_prompt"):
        data.pop(key, None)
    data["decode_padding"] = "common_end"
    data["batch_copy"] = BatchCopy(5e-4, 1e-4, 1e-6).to_dict()
    return Profile.from_dict(data, source="test")


def test_the_simulator_charges_each_change_of_the_batch():
    """Request 0 (94 prompt tokens, one decode step) and request 1 (58, two) arrive at once:
    the first decode step builds both rows to request 0's 95 (the simulator's frame counts the
    step's token: 2 x 95 written), the second runs request 1 alone in place at 96 (request 0's
    row left: 1 x 96 written). Request 1's decode time is both steps' prices."""
    b = TraceBuilder("batch-copy")
    b.add(0, 0.0, 10, 2, [5], [60])
    b.add(1, 0.0, 5, 3, [2], [29])
    config = build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                           "arrival": "trace", "speculate": False, "search_s": 0.001,
                           "system_prompt_tokens": SYSTEM_PROMPT_TOKENS})
    result = run_simulation(b.build({"name": "batch-copy"}), config, linear_decode_with_copy())
    columns = result.columns
    decode_s = columns["finish_s"][1] - columns["first_token_s"][1]
    steps = [(1e-3 + 1e-5 * 95) + (5e-4 + 2 * 1e-4 + 1e-6 * 2 * 95),
             (1e-3 + 1e-5 * 96) + (5e-4 + 1 * 1e-4 + 1e-6 * 1 * 96)]
    assert decode_s == pytest.approx(sum(steps), rel=1e-9)


def test_the_replay_charges_the_rows_the_engine_wrote():
    profile = linear_decode_with_copy()
    step = {"kind": "decode", "size": 2, "context_tokens": 77.0, "padded_context_tokens": 95}
    assert priced_s(step, profile) == pytest.approx(1e-3 + 1e-5 * 95)  # unchanged batch
    changed = {**step, "batch_change": "rebuild", "batch_rows": 2, "batch_row_tokens": 188}
    assert priced_s(changed, profile) == pytest.approx(
        1e-3 + 1e-5 * 95 + 5e-4 + 2 * 1e-4 + 1e-6 * 188)


def test_the_profiler_times_the_write_from_one_row_to_its_largest_batch():
    """Rows 1, 4, 16, 64 up to the plan's largest decode batch (and it), by each decode
    context, where twice the KV fits in half the memory."""
    from ragsim.profiles.profiler import ProfilePlan

    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 16], batch_sizes=[1, 2, 32],
                       context_tokens=[16, 1_024], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12], warmup=0, repetitions=1)
    assert batch_copy_cells(plan, 1_000, 10**12) == [
        (r, t) for r in (1, 4, 16, 32) for t in (16, 1_024)]
    # 2 x (32 + 1) x 1,024 x 1,000 bytes = 67.6 MB: past half of 100 MB, kept within 200 MB
    assert (32, 1_024) not in batch_copy_cells(plan, 1_000, 10**8)
    assert (32, 1_024) in batch_copy_cells(plan, 1_000, 2 * 10**8)


def test_a_torch_profile_measures_the_term(tiny_torch_profile):
    """The tiny profile (batch sizes 1-2, contexts 16 and 32) timed the engine's write at each
    cell three times; the term read back from its file is the fit of those timings."""
    from ragsim.profiles.profiler import BATCH_COPY_REPEATS

    profile = load_profile(str(tiny_torch_profile))
    term = profile.batch_copy
    assert term is not None
    cells = sorted((int(r), int(t)) for r, t, _ in term.fit["timings"])
    assert cells == sorted((r, t) for r in (1, 2) for t in (16, 32)
                           for _ in range(BATCH_COPY_REPEATS))
    assert all(s > 0 for _, _, s in term.fit["timings"])
    assert fit_batch_copy(term.fit["timings"]) == term
