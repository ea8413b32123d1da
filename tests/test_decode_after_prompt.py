"""The decode steps after a step with prompts (``ragsim.profiles.decode_after_prompt``): the
fit and the interpolation on hand-worked numbers, the file's checks, that the simulator, the
replay of a real run's steps and the torch harness's per-iteration comparison charge each such
step by its position and the prompt step's size and only there, and that the torch profiler
times them on the engine's own first batch."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import simpy
from test_sim_mixed import config, trace_of

from ragsim.decisions import priced_s, priced_steps
from ragsim.errors import ProfileError
from ragsim.profiles.decode_after_prompt import (
    DECODE_AFTER_PROMPT_MODEL,
    DECODE_POSITIONS,
    FIRST_DECODE_STEPS,
    STEADY_FROM,
    AfterPrompt,
    DecodeAfterPrompt,
    first_decode_cells,
    fit_decode_after_prompt,
    positions_row,
)
from ragsim.profiles.profile import Profile, load_profile
from ragsim.serving.engine import Job
from ragsim.sim.predicted import PredictedIterations
from ragsim.sim.simulator import run_simulation

BASE = load_profile("a10g-mistral-7b")
MS = 1e-3
# after a prompt step of 100 new tokens: +3 ms at the first decode step, +1 ms at the second;
# after 500: +5 and +2 ms. At 400 tokens (three quarters of the way): +4.5 and +1.75 ms
TERM = DecodeAfterPrompt((100, 500), ((3 * MS, 1 * MS), (5 * MS, 2 * MS)))
AT_400 = (4.5 * MS, 1.75 * MS)
FLAT = DecodeAfterPrompt((0,), ((3 * MS, 1 * MS),))  # the same at every prompt size


def with_term(term: DecodeAfterPrompt = TERM) -> Profile:
    return Profile.from_dict({**BASE.to_dict(), "decode_after_prompt": term.to_dict()},
                             source="test.json")


def test_fit_averages_each_positions_extra_over_the_rows_per_prompt_size():
    """Three cells of two positions, repeats of [steady, t_1, t_2] (ms). 1 row x 256 tokens:
    steadies 4, 4.5, 3 (median 4), t_1 6, 7, 5 (median 6), t_2 5, 5, 4.5 (median 5): +2, +1.
    2 rows x 256: steadies 6, 6.5, 5.5 (6), t_1 9, 9, 8 (9), t_2 6, 7, 6.5 (6.5): +3, +0.5.
    256 tokens: their mean, +2.5, +0.75. 1 row x 768: steadies 4, 4 (4), t_1 3, 3.5 (3.25),
    t_2 4.5, 5 (4.75): -0.75 clipped to 0, +0.75."""
    rows = [[1, 256, 4, 6, 5], [1, 256, 4.5, 7, 5], [1, 256, 3, 5, 4.5],
            [2, 256, 6, 9, 6], [2, 256, 6.5, 9, 7], [2, 256, 5.5, 8, 6.5],
            [1, 768, 4, 3, 4.5], [1, 768, 4, 3.5, 5]]
    fitted = fit_decode_after_prompt([[r, c, *(x * MS for x in t)] for r, c, *t in rows])
    assert fitted.prompt_tokens == (256, 768)
    assert np.array(fitted.extra_s) == pytest.approx(np.array([[2.5, 0.75], [0.0, 0.75]]) * MS)
    assert fitted.fit["cells"] == [[1, 256], [1, 768], [2, 256]]
    assert np.array(fitted.fit["extra_s_by_cell"]) == pytest.approx(
        np.array([[2, 1], [-0.75, 0.75], [3, 0.5]]) * MS)
    assert fitted.fit["steady_s_by_cell"] == pytest.approx([4 * MS, 4 * MS, 6 * MS])
    with pytest.raises(ValueError, match="at least one"):
        fit_decode_after_prompt([])


def test_a_repeat_keeps_its_positions_and_the_median_of_its_steady_steps():
    """24 steps timed 1, 2, ..., 24 ms: positions 1-12 are the first twelve, the steady time
    the median of the 17th-24th (17..24 ms: 20.5 ms)."""
    times = [k * MS for k in range(1, FIRST_DECODE_STEPS + 1)]
    row = positions_row(2, 256, times)
    assert row[:3] == [2.0, 256.0, pytest.approx(20.5 * MS)]
    assert row[3:] == pytest.approx(times[:DECODE_POSITIONS])
    assert STEADY_FROM > DECODE_POSITIONS  # the steady steps lie past the positions charged
    with pytest.raises(ValueError, match="decode steps are timed"):
        positions_row(1, 256, times[:-1])


def test_the_extra_lies_linearly_between_the_prompt_sizes_measured():
    """Between 100 and 500 tokens linear (at 400: +4.5, +1.75 ms); below and above, the
    nearest size's; nothing at position 0 or past the positions measured."""
    assert TERM.at(1, 400) == pytest.approx(AT_400[0])
    assert TERM.at(2, 400) == pytest.approx(AT_400[1])
    assert TERM.at(1, 20) == pytest.approx(3 * MS) and TERM.at(2, 9000) == pytest.approx(2 * MS)
    assert TERM.at(0, 400) == 0.0 and TERM.at(3, 400) == 0.0


def test_the_cells_keep_within_the_plans_decode_axis():
    assert first_decode_cells([64, 1024, 4096]) == [
        (1, 256), (1, 768), (1, 2048), (2, 256), (2, 768), (2, 2048)]
    # a short axis: every size falls on its longest
    assert first_decode_cells([64, 128]) == [(1, 128), (2, 128)]
    assert first_decode_cells([512, 1024]) == [(1, 512), (1, 768), (1, 1024), (2, 512),
                                               (2, 768), (2, 1024)]


@pytest.mark.parametrize(("change", "message"), [
    ({"extra_s": [[-0.001, 0.0], [0.0, 0.0]]}, ">= 0"),
    ({"extra_s": [["1 ms", 0.0], [0.0, 0.0]]}, ">= 0"),
    ({"extra_s": [[float("nan"), 0.0], [0.0, 0.0]]}, ">= 0"),
    ({"extra_s": [[0.001, 0.0], [0.0]]}, "all of one length"),
    ({"extra_s": [[0.001, 0.0]]}, "one list of seconds per prompt size"),
    ({"prompt_tokens": [500, 100]}, "increasing"),
    ({"prompt_tokens": [100, 100.5]}, "increasing"),
    ({"model": "x"}, "unknown model"),
    ({"model": DECODE_AFTER_PROMPT_MODEL, "extra_s": -1.0}, ">= 0"),
])
def test_a_bad_term_names_its_field(change, message):
    with pytest.raises(ProfileError, match=message) as raised:
        Profile.from_dict({**BASE.to_dict(),
                           "decode_after_prompt": {**TERM.to_dict(), **change}},
                          source="t.json")
    assert raised.value.field.startswith("decode_after_prompt.")
    assert raised.value.file == "t.json"


def test_the_term_survives_a_file_and_scales_with_the_machine(tmp_path):
    profile = with_term()
    assert load_profile(str(profile.save(tmp_path / "p.json"))).decode_after_prompt == TERM
    assert np.array(profile.scaled_compute(2.0).decode_after_prompt.extra_s) == pytest.approx(
        2 * np.array(TERM.extra_s))
    assert BASE.decode_after_prompt is None


def test_a_profile_measured_before_the_positions_charges_its_number_at_the_first():
    """The earlier term, one number: charged to the first decode step after any prompt step."""
    old = {"model": DECODE_AFTER_PROMPT_MODEL, "extra_s": 0.002, "fit": {}}
    term = Profile.from_dict({**BASE.to_dict(), "decode_after_prompt": old},
                             source="old.json").decode_after_prompt
    assert [term.at(k, n) for k in (1, 2) for n in (1, 4000)] == [0.002, 0.002, 0.0, 0.0]


def _job(key: int) -> Job:
    job = Job(key, key, [1], [300], 100, 8, speculative=False)
    job.alpha, job.beta = 0, 400
    job.context_tokens = 400
    return job


def test_the_simulated_engine_charges_each_decode_step_by_its_position_after_prompts():
    """Step by step on the simulator's iterations: a decode step with no prompt step before
    it pays nothing; after a prefill of 400 new tokens the next decode steps pay +4.5, +1.75
    ms and then nothing; a run of decode steps priced at once (``decode_durations``) pays the
    same by position, and a run cut short after one step leaves the next step at the second
    position; a mixed step's prompt chunks count as a prompt step of their tokens (100: +3
    ms); a GPU failure forgets the prompt step before it."""
    env = simpy.Environment()
    plain = PredictedIterations(env, BASE, False)
    charged = PredictedIterations(simpy.Environment(), with_term(), False)
    a, b = _job(0), _job(1)

    def decode(engine) -> float:
        return engine.env.run(engine.env.process(engine.decode({a}, 400.0)))

    def prefill(engine) -> None:
        engine.env.run(engine.env.process(engine.prefill([b])))

    steady = decode(plain)
    assert decode(charged) == pytest.approx(steady, rel=1e-12)  # no prompt step before it
    prefill(charged)
    assert [decode(charged) - steady for _ in range(3)] == pytest.approx(
        [*AT_400, 0.0], abs=1e-12)
    prefill(charged)
    run = charged.decode_durations(1, 400, 3, [a])
    same = plain.decode_durations(1, 400, 3, [a])
    assert [x - y for x, y in zip(run, same, strict=True)] == pytest.approx(
        [*AT_400, 0.0], abs=1e-12)
    charged.decode_run_ended(3)
    assert decode(charged) == pytest.approx(steady, rel=1e-12)
    prefill(charged)
    charged.decode_durations(1, 400, 3, [a])
    charged.decode_run_ended(1)  # a job arrived: one step of the run ran
    assert decode(charged) - steady == pytest.approx(AT_400[1], abs=1e-12)
    charged.env.run(charged.env.process(charged.mixed([(b, 100)], {a}, 400.0)))
    assert decode(charged) - steady == pytest.approx(3 * MS, abs=1e-12)
    prefill(charged)
    charged.gpu_failed()
    assert decode(charged) == pytest.approx(steady, rel=1e-12)


@pytest.mark.parametrize("scheduler", ["prefill-first", "mixed"])
def test_a_request_finishes_its_positions_charges_later(scheduler):
    """One request decoding 40 tokens alone: its first two decode steps follow its prompt's
    step and pay 3 and 1 ms (a term the same at every prompt size), no later step does; its
    first token is not moved, its last comes 4 ms later, under both schedulers (prefill-first
    prices runs of steps, mixed step by step). A request of one output token has no decode
    step: nothing moves."""
    trace = trace_of([(0.0, 300, 100, 40), (10.0, 300, 100, 1)])
    settings = config(scheduler, cache=False)
    plain = run_simulation(trace, settings, BASE).records
    charged = run_simulation(trace, settings, with_term(FLAT)).records
    assert charged["first_token_s"][0] == pytest.approx(plain["first_token_s"][0], rel=1e-12)
    assert charged["finish_s"][0] - plain["finish_s"][0] == pytest.approx(0.004, rel=1e-9)
    assert charged["finish_s"][1] == pytest.approx(plain["finish_s"][1], rel=1e-12)


DECISIONS = [  # a torch run's steps: prefill, decode, decode, prefill, decode
    {"kind": "prefill", "start_s": 0.0, "end_s": 0.02, "jobs": [(0, 0, 0, 400, 0)]},
    {"kind": "decode", "start_s": 0.02, "end_s": 0.03, "size": 1, "context_tokens": 401.0},
    {"kind": "decode", "start_s": 0.03, "end_s": 0.04, "size": 1, "context_tokens": 402.0},
    {"kind": "prefill", "start_s": 0.04, "end_s": 0.06, "jobs": [(1, 1, 0, 400, 0)]},
    {"kind": "decode", "start_s": 0.06, "end_s": 0.07, "size": 2, "context_tokens": 402.0}]
VLLM_STEPS = [  # a vLLM run's: a prompt, decodes alone, a prompt beside a decode, an empty
    # step, decodes alone
    {"kind": "mixed", "start_s": 0.0, "end_s": 0.02, "jobs": [(0, 0, 0, 400, 0)], "size": 0,
     "context_tokens": 0.0},
    {"kind": "mixed", "start_s": 0.02, "end_s": 0.03, "jobs": [], "size": 1,
     "context_tokens": 401.0},
    {"kind": "mixed", "start_s": 0.03, "end_s": 0.05, "jobs": [(1, 1, 0, 400, 0)], "size": 1,
     "context_tokens": 402.0},
    {"kind": "mixed", "start_s": 0.05, "end_s": 0.05, "jobs": [], "size": 0,
     "context_tokens": 0.0},
    {"kind": "mixed", "start_s": 0.05, "end_s": 0.06, "jobs": [], "size": 2,
     "context_tokens": 402.0}]


@pytest.mark.parametrize(("steps", "positions"), [(DECISIONS, [0, 1, 2, 0, 1]),
                                                   (VLLM_STEPS, [0, 1, 0, 0, 1])])
def test_the_replay_charges_the_decode_steps_by_position_after_prompts(steps, positions):
    """The replay's prices, fed the steps in order, add to each decode-only step its position's
    extra after the last step with prompts (a torch decode after a prefill of 400 new tokens:
    +4.5, then +1.75 ms; a vLLM step of decodes alone after one with prompt chunks, a step with
    prompt chunks beside decodes paying nothing and resetting the count, an empty step in
    between changing nothing), and ``priced_steps`` writes each step's position."""
    profile = with_term()
    after = AfterPrompt(profile.decode_after_prompt)
    charged = [priced_s(d, profile, False, None, after) for d in steps]
    plain = [priced_s(d, BASE) for d in steps]
    extra = [c - p for c, p in zip(charged, plain, strict=True)]
    assert extra == pytest.approx([AT_400[k - 1] if k else 0.0 for k in positions], abs=1e-15)
    rows = priced_steps(steps, lambda d: 0.0)
    assert [row["decodes_after_prompts"] for row in rows] == positions
    assert [row["after_prompts"] for row in rows] == [k == 1 for k in positions]


def test_the_torch_harness_prices_the_steps_after_a_prefill():
    """A prefill of 300 new tokens, then two decode steps: +4 and +1.5 ms (halfway between
    the sizes measured)."""
    from ragsim.realrun.harness import cost_model_errors

    log = [("prefill", [0], [300], 0.05, 0.0, 0.0), ("decode", 1, 301.0, 0.01, True, 0.0, 301),
           ("decode", 1, 302.0, 0.01, False, 0.0, 302)]
    priced, plain = cost_model_errors(log, with_term()), cost_model_errors(log, BASE)
    assert priced["decode_rebuilt"]["predicted_s"] == pytest.approx(
        plain["decode_rebuilt"]["predicted_s"] + 4 * MS, rel=1e-12)
    assert priced["decode"]["predicted_s"] == pytest.approx(
        plain["decode"]["predicted_s"] + 1.5 * MS, rel=1e-12)


def test_the_torch_profiler_times_the_engines_first_batch_after_a_prefill():
    """``TorchEngine.first_decode`` on a small model: one row per repeat, its steady time and
    every position's positive, and the fit's extras are the positions' medians less the
    steady median, worked here from the rows."""
    from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
    from ragsim.profiles.profiler import TorchEngine

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    engine = TorchEngine(spec, "cpu", "fp32", 1, 0)
    rows = engine.first_decode(2, 48, 3)
    assert len(rows) == 3
    assert all(r[:2] == [2.0, 48.0] and len(r) == 3 + DECODE_POSITIONS
               and min(r[2:]) > 0 for r in rows)
    fitted = fit_decode_after_prompt(rows)
    steady = statistics.median(r[2] for r in rows)
    expected = [max(0.0, statistics.median(r[3 + k] for r in rows) - steady)
                for k in range(DECODE_POSITIONS)]
    assert fitted.prompt_tokens == (48,)
    assert fitted.extra_s[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_the_joiners_cache_decodes_as_the_prefills_own_cache():
    """The batch the engine builds from its joiners' KV (``joiners_decode_cache``) gives the
    same next tokens as continuing the prefill's own cache: rows of 40 and 56 tokens,
    left-padded to 56 under the step's mask."""
    from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
    from ragsim.profiles.torch_model import (
        Row,
        TorchModel,
        decode_step_batch,
        joiners_decode_cache,
    )

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=128).with_dtype("fp32")
    model = TorchModel.build(spec, "cpu", "fp32", 1, 0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, spec.vocab_size, size=n) for n in (40, 56)]
    for i, prompt in enumerate(prompts):  # each row alone, its own cache continued
        alone = model.prefill([Row(None, prompt, 0)])
        token = model.greedy(alone.logits)
        expected = model.greedy(model.decode(alone.batch, token))
        both = model.prefill([Row(None, p, 0) for p in prompts])
        firsts = model.greedy(both.logits)
        cache, storage, end = joiners_decode_cache(model, both.new_kv, [40, 56])
        assert end == 56 and len(storage) == model.num_layers
        logits = model.forward(decode_step_batch(model, cache, [40, 56], end, firsts))
        assert firsts[i] == token[0]
        assert model.greedy(logits)[i] == expected[0]


def test_the_torch_profiler_times_the_steps_after_prompts_at_every_cell(tiny_torch_profile):
    """A profile run times each cell (rows 1-2, prompt sizes within the plan's decode axis [16,
    32]: all at its longest, 32) ``FIRST_DECODE_REPEATS`` times, keeps the raw rows and fits the
    term from them (worked here from the raw rows: per cell and position the median less the
    median steady, the mean over the rows); the term is read back from the profile's file."""
    from ragsim.profiles.decode_after_prompt import FIRST_DECODE_REPEATS

    profile = load_profile(str(tiny_torch_profile))
    raw = profile.obtained["raw"]["first_decode"]
    assert sorted((int(r[0]), int(r[1])) for r in raw) == sorted(
        (r, 32) for r in (1, 2) for _ in range(FIRST_DECODE_REPEATS))
    by_rows = [[statistics.median(r[3 + k] for r in raw if r[0] == n)
                - statistics.median(r[2] for r in raw if r[0] == n)
                for k in range(DECODE_POSITIONS)] for n in (1, 2)]
    term = profile.decode_after_prompt
    assert term is not None and term.prompt_tokens == (32,)
    assert np.array(term.fit["extra_s_by_cell"]) == pytest.approx(np.array(by_rows), rel=1e-12)
    assert term.extra_s[0] == pytest.approx(
        [max(0.0, statistics.fmean(pair)) for pair in zip(*by_rows, strict=True)], rel=1e-12,
        abs=1e-15)


def test_profiles_show_prints_the_term(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    path = with_term().save(tmp_path / "p.json")
    shown = CliRunner().invoke(app, ["profiles", "show", str(path)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert ("the decode steps right after a step with prompts, by position: after 100 prompt "
            "tokens +3, +1 ms; after 500 prompt tokens +5, +2 ms") in shown.output
