"""A decode step right after a step with prompts (``ragsim.profiles.decode_after_prompt``): the
fit on hand-worked numbers, the file's checks, that the simulator, the replay of a real run's
steps and the torch harness's per-iteration comparison charge it to such a step and only
there, and that the torch profiler times it on the engine's own first batch."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import simpy
from test_sim_mixed import config, trace_of

from ragsim.decisions import priced_s, priced_steps
from ragsim.errors import ProfileError
from ragsim.profiles.decode_after_prompt import (
    AfterPrompt,
    DecodeAfterPrompt,
    first_decode_cells,
    fit_decode_after_prompt,
)
from ragsim.profiles.profile import Profile, load_profile
from ragsim.serving.engine import Job
from ragsim.sim.predicted import PredictedIterations
from ragsim.sim.simulator import run_simulation

BASE = load_profile("a10g-mistral-7b")
TERM = DecodeAfterPrompt(0.003)  # 3 ms
MS = 1e-3


def with_term(term: DecodeAfterPrompt = TERM) -> Profile:
    return Profile.from_dict({**BASE.to_dict(), "decode_after_prompt": term.to_dict()},
                             source="test.json")


def test_fit_averages_the_cells_first_less_steady_medians():
    """Two cells, three repeats each (ms). 1 row x 256: firsts 5, 6, 9 (median 6), steadies
    4, 4.5, 3 (median 4): +2. 2 rows x 768: firsts 7, 7.5, 7 (median 7), steadies 6, 6.5, 5.5
    (median 6): +1. The term: their mean, 1.5 ms. A cell whose first step ran faster than its
    steady ones counts as it is; only the mean is clipped at 0."""
    rows = [[1, 256, 5 * MS, 4 * MS], [1, 256, 6 * MS, 4.5 * MS], [1, 256, 9 * MS, 3 * MS],
            [2, 768, 7 * MS, 6 * MS], [2, 768, 7.5 * MS, 6.5 * MS], [2, 768, 7 * MS, 5.5 * MS]]
    fitted = fit_decode_after_prompt(rows)
    assert fitted.extra_s == pytest.approx(1.5 * MS)
    assert fitted.fit["cells"] == [[1, 256], [2, 768]]
    assert fitted.fit["extra_s_by_cell"] == pytest.approx([2 * MS, 1 * MS])
    faster = [[1, 256, 3 * MS, 4 * MS], [2, 256, 5 * MS, 4.5 * MS]]  # -1 and +0.5: mean -0.25
    assert fit_decode_after_prompt(faster).extra_s == 0.0
    assert fit_decode_after_prompt(faster).fit["extra_s_by_cell"] == pytest.approx(
        [-1 * MS, 0.5 * MS])
    with pytest.raises(ValueError, match="at least one"):
        fit_decode_after_prompt([])


def test_the_cells_keep_within_the_plans_decode_axis():
    assert first_decode_cells([64, 1024, 4096]) == [(1, 256), (1, 768), (2, 256), (2, 768)]
    # a short axis: both contexts fall on its longest
    assert first_decode_cells([64, 128]) == [(1, 128), (2, 128)]
    assert first_decode_cells([512, 2048]) == [(1, 512), (1, 768), (2, 512), (2, 768)]


@pytest.mark.parametrize(("change", "message"), [
    ({"extra_s": -0.001}, ">= 0"),
    ({"extra_s": "1 ms"}, ">= 0"),
    ({"extra_s": float("nan")}, ">= 0"),
    ({"model": "x"}, "unknown model"),
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
    assert profile.scaled_compute(2.0).decode_after_prompt.extra_s == pytest.approx(0.006)
    assert BASE.decode_after_prompt is None


def _job(key: int) -> Job:
    job = Job(key, key, [1], [300], 100, 8, speculative=False)
    job.alpha, job.beta = 0, 400
    job.context_tokens = 400
    return job


def test_the_simulated_engine_charges_the_first_decode_step_after_prompts_only():
    """Step by step on the simulator's iterations: a decode step with no prompt step before
    it pays nothing; after a prefill, the next decode step pays 3 ms and the one after it
    nothing; a run of decode steps priced at once (``decode_durations``) pays it on its first
    step only, and once it ran, the next step nothing; a mixed step (prompt chunks) counts as
    a step with prompts; a GPU failure forgets the prompt step before it."""
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
    assert decode(charged) == pytest.approx(steady + 0.003, rel=1e-12)
    assert decode(charged) == pytest.approx(steady, rel=1e-12)
    prefill(charged)
    run = charged.decode_durations(1, 400, 3, [a])
    same = plain.decode_durations(1, 400, 3, [a])
    assert run == pytest.approx([same[0] + 0.003, same[1], same[2]], rel=1e-12)
    charged.decode_run_ended(3)
    assert decode(charged) == pytest.approx(steady, rel=1e-12)
    charged.env.run(charged.env.process(charged.mixed([(b, 100)], {a}, 400.0)))
    assert decode(charged) == pytest.approx(steady + 0.003, rel=1e-12)
    prefill(charged)
    charged.gpu_failed()
    assert decode(charged) == pytest.approx(steady, rel=1e-12)


@pytest.mark.parametrize("scheduler", ["prefill-first", "mixed"])
def test_a_request_finishes_one_charge_later(scheduler):
    """One request decoding 40 tokens alone: its first decode step follows its prompt's step
    and pays 3 ms, no later step does; its first token is not moved, its last comes 3 ms
    later, under both schedulers (prefill-first prices runs of steps, mixed step by step). A
    request of one output token has no decode step: nothing moves."""
    trace = trace_of([(0.0, 300, 100, 40), (10.0, 300, 100, 1)])
    settings = config(scheduler, cache=False)
    plain = run_simulation(trace, settings, BASE).records
    charged = run_simulation(trace, settings, with_term()).records
    assert charged["first_token_s"][0] == pytest.approx(plain["first_token_s"][0], rel=1e-12)
    assert charged["finish_s"][0] - plain["finish_s"][0] == pytest.approx(0.003, rel=1e-9)
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


@pytest.mark.parametrize(("steps", "charged_at"), [(DECISIONS, [1, 4]), (VLLM_STEPS, [1, 4])])
def test_the_replay_charges_a_decode_step_right_after_prompts(steps, charged_at):
    """The replay's prices, fed the steps in order, add 3 ms to the decode-only steps that
    follow a step with prompts (a torch decode after a prefill; a vLLM step of decodes alone
    after one with prompt chunks, an empty step in between changing nothing), and
    ``priced_steps`` marks those rows."""
    profile = with_term()
    after = AfterPrompt(profile.decode_after_prompt)
    charged = [priced_s(d, profile, False, None, after) for d in steps]
    plain = [priced_s(d, BASE) for d in steps]
    extra = [c - p for c, p in zip(charged, plain, strict=True)]
    assert extra == pytest.approx([0.003 if i in charged_at else 0.0
                                   for i in range(len(steps))], abs=1e-15)
    rows = priced_steps(steps, lambda d: 0.0)
    assert [i for i, row in enumerate(rows) if row["after_prompts"]] == charged_at


def test_the_torch_harness_prices_the_step_after_a_prefill():
    from ragsim.realrun.harness import cost_model_errors

    log = [("prefill", [0], [300], 0.05, 0.0, 0.0), ("decode", 1, 301.0, 0.01, True, 0.0, 301),
           ("decode", 1, 302.0, 0.01, False, 0.0, 302)]
    priced, plain = cost_model_errors(log, with_term()), cost_model_errors(log, BASE)
    assert priced["decode_rebuilt"]["predicted_s"] == pytest.approx(
        plain["decode_rebuilt"]["predicted_s"] + 0.003, rel=1e-12)
    assert priced["decode"]["predicted_s"] == pytest.approx(plain["decode"]["predicted_s"],
                                                            rel=1e-12)


def test_the_torch_profiler_times_the_engines_first_batch_after_a_prefill():
    """``TorchEngine.first_decode`` on a small model: one row per repeat of each timed step,
    first and steady positive, and the steps run the engine's own path: the greedy tokens
    of the first step and the steady ones are those a plain prefill + decode gives."""
    from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
    from ragsim.profiles.profiler import TorchEngine

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    engine = TorchEngine(spec, "cpu", "fp32", 1, 0)
    rows = engine.first_decode(2, 48, 3)
    assert len(rows) == 3
    assert all(r[:2] == [2.0, 48.0] and r[2] > 0 and r[3] > 0 for r in rows)
    fitted = fit_decode_after_prompt(rows)
    first = statistics.median(r[2] for r in rows)
    steady = statistics.median(r[3] for r in rows)
    assert fitted.extra_s == pytest.approx(max(0.0, first - steady), rel=1e-12)


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


def test_the_torch_profiler_times_the_first_decode_step_at_every_cell(tiny_torch_profile):
    """A profile run times each cell (rows 1-2, contexts within the plan's decode axis [16, 32]:
    both at its longest, 32) ``FIRST_DECODE_REPEATS`` times, keeps the raw rows and fits the
    term from them (worked here from the raw rows: per cell median first less median
    steady); the term is read back from the profile's file."""
    from ragsim.profiles.decode_after_prompt import FIRST_DECODE_REPEATS

    profile = load_profile(str(tiny_torch_profile))
    raw = profile.obtained["raw"]["first_decode"]
    assert sorted((int(r), int(c)) for r, c, _, _ in raw) == sorted(
        (r, 32) for r in (1, 2) for _ in range(FIRST_DECODE_REPEATS))
    by_cell = [statistics.median(f for r, _, f, _ in raw if r == n)
               - statistics.median(s for r, _, _, s in raw if r == n) for n in (1, 2)]
    term = profile.decode_after_prompt
    assert term is not None
    assert term.fit["extra_s_by_cell"] == pytest.approx(by_cell, rel=1e-12)
    assert term.extra_s == pytest.approx(max(0.0, statistics.fmean(by_cell)), rel=1e-12)


def test_profiles_show_prints_the_term(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    path = with_term().save(tmp_path / "p.json")
    shown = CliRunner().invoke(app, ["profiles", "show", str(path)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "a decode step right after a step with prompts: +3 ms" in shown.output
