"""Pool orders (issue 26): FCFS, cache-aware (OrderPriority), SJF and LPM on hand-made queues.

Each queue is written so that the four orders disagree; the expected order of service is worked
out by hand from each order's definition, not read from the code:

* cache-aware: highest cached / to-compute first;
* sjf: fewest tokens to compute (the uncached prompt) first;
* lpm: most tokens cached first;
* fcfs: arrival order.
"""

from __future__ import annotations

import pytest

from ragsim.cache.reorder import ORDERS, RequestPool
from ragsim.errors import ConfigError
from ragsim.serving.config import build_config

# key -> (cached tokens, tokens to compute), arrival order A, B, C, D
QUEUE = {
    "A": (100, 900),   # cached/compute 0.11, compute 900, cached 100
    "B": (1500, 1500),  # 1.0, 1500, 1500 (the longest cached prefix)
    "C": (0, 200),     # 0.0, 200 (the shortest job), 0
    "D": (600, 300),   # 2.0 (the best ratio), 300, 600
}
# by hand: sort by each order's key, ties never happen in this queue
EXPECTED = {
    "fcfs": ["A", "B", "C", "D"],
    "cache-aware": ["D", "B", "A", "C"],  # ratios 2.0, 1.0, 0.11, 0.0
    "sjf": ["C", "D", "A", "B"],          # to compute 200, 300, 900, 1500
    "lpm": ["B", "D", "A", "C"],          # cached 1500, 600, 100, 0
}


def served(order: str, queue: dict = QUEUE) -> list[str]:
    pool = RequestPool(reorder=order != "fcfs", order=order, window_s=100.0)
    for key in queue:
        pool.add(key, key, now_s=0.0)
    taken = []
    while pool:
        key, _ = pool.peek(queue.get, now_s=1.0)
        pool.take(key, now_s=1.0)
        taken.append(key)
    return taken


@pytest.mark.parametrize("order", ORDERS)
def test_each_order_serves_the_hand_made_queue_as_defined(order):
    assert served(order) == EXPECTED[order]


def test_ties_keep_the_older_request_under_every_order():
    same = {"X": (10, 10), "Y": (10, 10), "Z": (10, 10)}
    for order in ORDERS:
        assert served(order, same) == ["X", "Y", "Z"]


def test_sjf_ignores_the_cached_length_and_lpm_the_computed_one():
    # P and Q compute the same; only the cache tells them apart: SJF keeps arrival order, LPM
    # takes the cached one; R and S cache the same: LPM keeps arrival order, SJF the short one
    assert served("sjf", {"P": (0, 50), "Q": (999, 50)}) == ["P", "Q"]
    assert served("lpm", {"P": (0, 50), "Q": (999, 50)}) == ["Q", "P"]
    assert served("lpm", {"R": (5, 900), "S": (5, 10)}) == ["R", "S"]
    assert served("sjf", {"R": (5, 900), "S": (5, 10)}) == ["S", "R"]


@pytest.mark.parametrize("order", ["cache-aware", "sjf", "lpm"])
def test_the_window_bounds_every_reordering_order_alike(order):
    # the oldest request is the worst under every order; once it has waited the window (2 s,
    # from arrival with start="arrival") the next decision takes it whatever the order says
    queue = {"OLD": (0, 5000), "NEW": (4000, 10)}
    pool = RequestPool(reorder=True, order=order, window_s=2.0, start="arrival")
    pool.add("OLD", "OLD", now_s=0.0)
    pool.add("NEW", "NEW", now_s=0.5)
    assert pool.peek(queue.get, now_s=1.9)[0] == "NEW"
    assert pool.peek(queue.get, now_s=2.0)[0] == "OLD"


def test_a_pool_refuses_an_order_that_contradicts_reorder():
    with pytest.raises(ValueError, match="order"):
        RequestPool(reorder=False, order="sjf")
    with pytest.raises(ValueError, match="order"):
        RequestPool(reorder=True, order="fifo")
    assert RequestPool(reorder=True).order == "cache-aware"
    assert RequestPool(reorder=False).order == "fcfs"


def test_config_order_and_reorder_say_one_thing():
    assert build_config({}).order == "cache-aware"
    assert build_config({"system": "sglang"}).order == "fcfs"
    c = build_config({"system": "sglang", "order": "sjf"})
    assert (c.order, c.reorder) == ("sjf", True)  # an order over a preset's reorder=False
    c = build_config({"order": "fcfs"})
    assert (c.order, c.reorder) == ("fcfs", False)
    c = build_config({"reorder": False})
    assert (c.order, c.reorder) == ("fcfs", False)
    with pytest.raises(ConfigError, match="order"):
        build_config({"order": "lpm", "reorder": False})
    with pytest.raises(ConfigError, match="order"):
        build_config({"order": "shortest"})
    # a recorded configuration reruns as it ran
    c = build_config({"order": "lpm"})
    assert build_config({}, base=c.to_dict()) == c


def test_order_is_sweepable(tmp_path, monkeypatch):
    import ragsim

    monkeypatch.chdir(tmp_path)
    table = ragsim.sweep({"base": {"trace": "mmlu", "n_requests": 40, "rate_rps": 4.0},
                          "axes": {"order": ["fcfs", "sjf", "lpm"]}, "seeds": [0]}, jobs=1)
    assert list(table["order"]) == ["fcfs", "sjf", "lpm"]
    assert list(table["reorder"]) == [False, True, True]


def test_replace_keeps_order_and_reorder_together():
    # what --backend vllm does to ragcache (reorder off) must not leave cache-aware behind
    c = build_config({}).replace(reorder=False)
    assert (c.order, c.reorder) == ("fcfs", False)
    c = build_config({"system": "sglang"}).replace(order="lpm")
    assert (c.order, c.reorder) == ("lpm", True)
    lpm = build_config({"system": "sglang-lpm"})
    assert lpm.replace(reorder=True).order == "lpm"  # no change, the preset's order stays
