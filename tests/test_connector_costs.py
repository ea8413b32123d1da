"""A KV connector's work inside the steps (``serving.connector_costs``): the simulation and the
replay of a real run price it by one rule, and the probe reads it off the connector's timers
(``realrun.vllm.loop.connector_costs``).

Expected values are worked by hand: which tokens of a prompt a chunk computes, the price of one
recorded step, a sequential simulation where each request pays its tree work once and its saves
for the documents it is the first to compute, and the per-unit rates of two runs' timers.
"""

from __future__ import annotations

import pytest
from test_sim import DOC_TOKENS, KV, PROFILE, SEARCH_S, make_trace, quiet, simulate

from ragsim.decisions import priced_s
from ragsim.realrun.vllm.loop import connector_costs
from ragsim.serving.config import build_config
from ragsim.serving.connector_costs import ConnectorCosts, saved_in_chunk


def test_a_step_pays_the_tree_work_of_its_new_requests_and_its_saves():
    costs = ConnectorCosts(request_s=0.002, save_s_per_token=1e-6, load_s_per_token=4e-7)
    assert costs.seconds(0, 0) == 0
    assert costs.seconds(3, 500) == pytest.approx(3 * 0.002 + 500e-6)
    assert costs.load_s(10 * KV, KV) == pytest.approx(10 * 4e-7)
    # no load rate measured: the profile's transfers price the loads
    assert ConnectorCosts(request_s=0.002).load_s(10 * KV, KV) is None
    assert ConnectorCosts.of(build_config({})) is None  # the default costs nothing
    assert ConnectorCosts.of(build_config({"connector_save_s_per_token": 1e-6})) == \
        ConnectorCosts(0.0, 1e-6, 0.0)


@pytest.mark.parametrize(("save", "prefilled", "take", "saved"), [
    (1600, 0, 512, 512),     # the first chunk: all its tokens are the new documents'
    (1600, 1536, 512, 64),   # the chunk that passes the documents' end: the query is not saved
    (1600, 1600, 50, 0),     # past the documents: nothing
    (0, 0, 512, 0),          # documents all cached: nothing to save
    (400, 0, 2048, 400),     # one chunk for the whole prompt
])
def test_a_chunk_saves_the_admitted_documents_tokens_it_computes(save, prefilled, take, saved):
    assert saved_in_chunk(save, prefilled, take) == saved


def test_config_refuses_a_negative_connector_cost():
    from ragsim.errors import ConfigError

    with pytest.raises(ConfigError, match="connector_save_s_per_token"):
        build_config({"connector_save_s_per_token": -1e-6})


def test_a_recorded_step_is_priced_with_the_connectors_work():
    """A real vLLM step that took two jobs' first chunks (one with 64 tokens' worth of host
    KV loaded), saved 96 tokens and decoded nothing: its price without the connector, plus
    2 x 0.002 s, plus 96 x 1e-6 s, with the load at 64 x 4e-7 s instead of the profile's
    transfer time for those bytes."""
    jobs = [(1, 0, 0, 300, 0), (2, 1, 64, 200, 64 * KV)]
    step = {"kind": "mixed", "start_s": 0.0, "end_s": 0.1, "jobs": jobs, "completing": [],
            "size": 0, "context_tokens": 0.0, "requests_started": 2, "saved_tokens": 96}
    bare = priced_s(step, PROFILE)
    h2d = PROFILE.transfers.host_to_device_s(64 * KV)
    costs = ConnectorCosts(request_s=0.002, save_s_per_token=1e-6, load_s_per_token=4e-7)
    assert priced_s(step, PROFILE, connector=costs) == pytest.approx(
        bare - h2d + 2 * 0.002 + 96e-6 + 64 * 4e-7, rel=1e-12)
    # without a load rate the profile's transfer stays
    assert priced_s(step, PROFILE, connector=ConnectorCosts(request_s=0.002)) == \
        pytest.approx(bare + 2 * 0.002, rel=1e-12)


# request 0 computes documents 1 and 3 (1,000 + 600 tokens); request 1, alone later, hits
# document 1 and computes document 4 (400); request 2 hits both of its documents (1, 3)
ROWS = [(0.0, [1, 3], 50, 1), (10.0, [1, 4], 50, 1), (20.0, [1, 3], 50, 1)]
SAVED = [DOC_TOKENS[1] + DOC_TOKENS[3], DOC_TOKENS[4], 0]


@pytest.mark.parametrize("scheduler", ["prefill-first", "mixed"])
def test_a_sequential_simulation_charges_each_request_its_tree_work_and_its_saves(scheduler):
    """One request at a time, each alone on the engine: its TTFT grows by the tree's work
    (once) and by the saves of the documents it is the first to compute, whether its prompt
    runs in one step or in chunks of 512 tokens (the mixed scheduler)."""
    trace = make_trace(ROWS)
    base = quiet(scheduler=scheduler, max_batched_tokens=512)
    records, _ = simulate(trace, base)
    charged, _ = simulate(trace, base.replace(connector_request_s=0.003,
                                              connector_save_s_per_token=2e-6))
    grew = (charged.ttft_s - records.ttft_s).to_numpy()
    assert grew == pytest.approx([0.003 + 2e-6 * s for s in SAVED], rel=1e-9)
    assert records.ttft_s[0] > SEARCH_S  # the runs priced their prefills


def test_the_probe_reads_the_connectors_rates_off_its_timers():
    """Two runs' host tiers (blocks of 16 and 32 tokens): 0.3 s over 150 requests served,
    0.02 s of saves over 100 x 16 + 50 x 32 tokens, 0.01 s of loads over 20 x 32 tokens."""
    tiers = [{"host_tier": {"scheduler_s": 0.1, "tree_access_s": 0.04, "requests_served": 50,
                            "save_s": 0.012, "load_s": 0.0, "blocks_copied_out": 100,
                            "blocks_copied_in": 0, "block_tokens": 16}},
             {"host_tier": {"scheduler_s": 0.2, "tree_access_s": 0.05, "requests_served": 100,
                            "save_s": 0.008, "load_s": 0.01, "blocks_copied_out": 50,
                            "blocks_copied_in": 20, "block_tokens": 32}},
             {"search": {}}]  # a run without the connector counts for nothing
    got = connector_costs(tiers)
    assert got["request_s"] == pytest.approx(0.3 / 150)
    assert got["tree_access_s"] == pytest.approx(0.09 / 150)
    assert got["save_s_per_token"] == pytest.approx(0.02 / 3200)
    assert got["load_s_per_token"] == pytest.approx(0.01 / 640)
    assert (got["tokens_saved"], got["tokens_loaded"]) == (3200, 640)
    assert connector_costs([{"search": {}}]) is None
