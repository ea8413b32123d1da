"""The knowledge tree's residency moves (``record_moves``/``drain_moves``), checked three ways.

1. A second implementation: a plain dict of node -> {"gpu", "host"} built from the moves alone
   must equal the tree's own residency after every operation, must never need more memory than
   the tree's capacities at any point of the move sequence, and each move's "before" state must
   be the one its kind names.
2. Hand-worked sequences, one or more per kind, on small LRU trees (expected moves by hand).
3. Drain semantics, and a tree that does not record: same behaviour, nothing recorded.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragsim.cache import MOVE_KINDS, KnowledgeTree, make_policy
from ragsim.cache.policies import POLICY_NAMES
from ragsim.cache.tree import FREQUENCY_SCOPES
from ragsim.profiles.profile import load_profile

TABLE = load_profile("a10g-mistral-7b").prefill
DOC_TOKENS = {d: 1 + (d * 7) % 9 for d in range(10)}
WINDOW_S = 2.0

# (before, after) of each kind as sets of tiers; "drop" may start from either single tier
BEFORE_AFTER = {
    "admit_gpu": ([set()], {"gpu"}),
    "swap_in": ([{"host"}], {"gpu", "host"}),
    "swap_out": ([{"gpu"}], {"gpu", "host"}),
    "free_gpu": ([{"gpu", "host"}], {"host"}),
    "free_host": ([{"gpu", "host"}], {"gpu"}),
    "drop": ([{"gpu"}, {"host"}], set()),
    "replicate": ([{"gpu"}], {"gpu", "host"}),
    "fail_gpu": ([{"gpu"}, {"gpu", "host"}], None),  # None: the GPU copy goes, the rest stays
}
# which kinds each operation may report
ALLOWED = {
    "access": {"admit_gpu", "swap_in", "swap_out", "free_gpu", "free_host", "drop"},
    "reserve": {"swap_out", "free_gpu", "free_host", "drop"},
    "replicate": {"replicate", "free_host", "drop"},
    "fail": {"fail_gpu", "drop"},
    "finish": set(),
}


class Pools:
    """The engine's view, rebuilt from moves alone: which tiers hold each node's KV."""

    def __init__(self, kt: KnowledgeTree) -> None:
        self.kt = kt
        self.where: dict = {}  # node -> set of "gpu"/"host"
        self.gpu_bytes = kt.root.size_bytes
        self.host_bytes = 0

    def apply(self, moves: list, op: str, reserved_bytes: int) -> None:
        previous = None
        for move in moves:
            kind, node = move.kind, move.node
            assert kind in MOVE_KINDS and kind in ALLOWED[op], (op, kind)
            assert node is not self.kt.root, "the root never moves"
            before = self.where.get(node, set())
            allowed_before, after = BEFORE_AFTER[kind]
            assert before in allowed_before, f"{kind} of {node} from {before}"
            if after is None:
                after = before - {"gpu"}
            self.gpu_bytes += node.size_bytes * (("gpu" in after) - ("gpu" in before))
            self.host_bytes += node.size_bytes * (("host" in after) - ("host" in before))
            self.where[node] = after
            # room first: the engine never holds more than the tree's capacities
            assert self.gpu_bytes + reserved_bytes <= self.kt.gpu_capacity_bytes, (kind, node)
            assert self.host_bytes <= self.kt.host_capacity_bytes, (kind, node)
            # copy before free: a swap-out is followed at once by the free of its GPU copy
            if previous is not None and previous.kind == "swap_out":
                assert (kind, node) == ("free_gpu", previous.node)
            previous = move
        assert previous is None or previous.kind != "swap_out"

    def check_equals_tree(self) -> None:
        for n in self.kt.iter_nodes():
            if n is self.kt.root:
                continue
            mine = self.where.get(n, set())
            assert ("gpu" in mine, "host" in mine) == (bool(n.in_gpu), bool(n.host_copy)), \
                f"{n}: moves say {mine}"


configs = st.fixed_dictionaries({
    "policy": st.sampled_from([p for p in POLICY_NAMES if p != "belady"]),
    "gpu": st.integers(0, 40),
    "host": st.integers(0, 60),
    "system": st.integers(0, 3),
    "depth": st.one_of(st.none(), st.integers(0, 3)),
    "scope": st.sampled_from(FREQUENCY_SCOPES),
})
operations = st.lists(
    st.tuples(
        st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
        st.integers(0, 8),  # private bytes a running request reserves
        st.sampled_from(["run", "run", "run", "replay", "finish", "fail", "replicate"]),
    ),
    min_size=1,
    max_size=60,
)


def make_tree(config: dict, record: bool) -> KnowledgeTree:
    window = WINDOW_S if config["scope"] == "window" else None
    return KnowledgeTree(make_policy(config["policy"]),
                         gpu_capacity_bytes=config["gpu"] + config["system"],
                         host_capacity_bytes=config["host"], kv_bytes_per_token=1,
                         prefill_cost_s=TABLE.at, system_prompt_tokens=config["system"],
                         max_cached_depth=config["depth"], frequency_scope=config["scope"],
                         frequency_window_s=window, record_moves=record)


def drive(kt: KnowledgeTree, ops: list, after_each=None) -> None:
    """Run ``ops`` on ``kt``: requests that run (pinned, with private memory) or finish at
    once, finishes, GPU failures, replication; ``after_each(op, reserved_before)``."""
    running: list = []
    for step, (docs, private, op) in enumerate(ops):
        reserved = kt.reserved_gpu_bytes
        kind = op
        if op == "finish":
            if running:
                path, held = running.pop(0)
                kt.release(path)
                kt.free_gpu(held)
        elif op == "fail":
            for path, held in running:
                kt.release(path)
                kt.free_gpu(held)
            running.clear()
            reserved = 0
            kt.fail_gpu()
        elif op == "replicate":
            kt.replicate_upper_nodes(2)
        else:
            tokens = [DOC_TOKENS[d] for d in docs]
            r = kt.access(docs, tokens, 0, keep_pinned=op == "run", now_s=float(step))
            if op == "run":
                if after_each is not None:  # the access's moves, then the reservation's
                    after_each("access", reserved)
                    reserved = kt.reserved_gpu_bytes
                kind = "reserve"
                running.append((r.path, private if kt.reserve_gpu(private) else 0))
            else:
                kind = "access"
        if after_each is not None:
            after_each(kind, reserved)
    for path, held in running:
        kt.release(path)
        kt.free_gpu(held)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, operations)
def test_moves_alone_rebuild_the_tree_residency(config, ops):
    kt = make_tree(config, record=True)
    pools = Pools(kt)

    def after_each(op: str, reserved_before: int) -> None:
        pools.apply(kt.drain_moves(), op, reserved_before)
        pools.check_equals_tree()

    drive(kt, ops, after_each)
    assert kt.drain_moves() == []


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, operations)
def test_recording_changes_nothing_and_off_records_nothing(config, ops):
    on, off = make_tree(config, record=True), make_tree(config, record=False)
    drive(on, ops)
    drive(off, ops)

    def state(kt: KnowledgeTree) -> tuple:
        nodes = sorted((tuple(n.path_keys()), bool(n.in_gpu), bool(n.host_copy), n.frequency)
                       for n in kt.iter_nodes())
        return (nodes, kt.evictions_gpu, kt.evictions_host, kt.swap_out_bytes,
                kt.swap_in_bytes, kt.dropped_bytes, kt.gpu_used_bytes, kt.host_used_bytes)

    assert state(on) == state(off)
    assert off.pending_moves == 0 and not off.record_moves
    with pytest.raises(ValueError, match="record_moves=True"):
        off.drain_moves()


# ---------------------------------------------------------------- hand-worked sequences
def lru(gpu: int, host: int) -> KnowledgeTree:
    return KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=gpu, host_capacity_bytes=host,
                         kv_bytes_per_token=1, record_moves=True)


def moves_of(kt: KnowledgeTree) -> list[tuple[str, int]]:
    """The drained moves as (kind, the node's last document id)."""
    return [(m.kind, m.node.key) for m in kt.drain_moves()]


def test_two_document_gpu_swaps_out_once_and_swaps_in():
    kt = lru(gpu=20, host=100)  # room for two 10-token documents in GPU
    steps = []
    for doc in [1, 2, 3, 1, 4, 5]:
        kt.access([doc], [10])
        steps.append(moves_of(kt))
    assert steps == [
        [("admit_gpu", 1)],
        [("admit_gpu", 2)],
        [("swap_out", 1), ("free_gpu", 1), ("admit_gpu", 3)],  # 1 is least recent
        [("swap_out", 2), ("free_gpu", 2), ("swap_in", 1)],  # room first, then the copy in
        [("swap_out", 3), ("free_gpu", 3), ("admit_gpu", 4)],
        [("free_gpu", 1), ("admit_gpu", 5)],  # 1 kept its host copy: no second swap-out
    ]


def test_no_host_memory_drops():
    kt = lru(gpu=10, host=0)
    kt.access([1], [10])
    kt.access([2], [10])
    assert moves_of(kt) == [("admit_gpu", 1), ("drop", 1), ("admit_gpu", 2)]


def test_a_gpu_node_the_host_cannot_take_drops_with_its_host_only_children():
    kt = lru(gpu=24, host=5)
    kt.access([1, 2], [10, 4])
    kt.access([3], [10])
    assert moves_of(kt) == [("admit_gpu", 1), ("admit_gpu", 2), ("admit_gpu", 3)]
    kt.access([4], [4])  # GPU leaves 2 (older) and 3: 2 goes to host (4 <= 5 bytes)
    assert moves_of(kt) == [("swap_out", 2), ("free_gpu", 2), ("admit_gpu", 4)]
    kt.access([5], [10])  # 1 is now a GPU leaf and the oldest; 10 bytes never fit in host
    assert moves_of(kt) == [("drop", 1), ("drop", 2), ("admit_gpu", 5)]


def test_full_host_frees_a_host_copy_or_drops():
    kt = lru(gpu=20, host=10)
    for doc in [1, 2, 3]:
        kt.access([doc], [10])
    assert moves_of(kt)[-3:] == [("swap_out", 1), ("free_gpu", 1), ("admit_gpu", 3)]
    # host hit on 1: evicting 2 needs host room, but the host holds only 1, pinned now
    kt.access([1], [10])
    assert moves_of(kt) == [("drop", 2), ("swap_in", 1)]
    # 2 again: evicting 3 needs host room; 1 is in GPU too, so its host copy is freed
    kt.access([2], [10])
    assert moves_of(kt) == [("free_host", 1), ("swap_out", 3), ("free_gpu", 3),
                            ("admit_gpu", 2)]


def test_replicas_are_copies_a_later_eviction_does_not_repeat():
    kt = lru(gpu=30, host=30)
    for doc in [1, 1, 2, 3]:
        kt.access([doc], [10])
    kt.drain_moves()
    assert kt.replicate_upper_nodes(1) == 10  # 1 is the most retrieved
    assert moves_of(kt) == [("replicate", 1)]
    kt.access([4], [10])  # 1 is the least recent: its replica is its host copy
    assert moves_of(kt) == [("free_gpu", 1), ("admit_gpu", 4)]


def test_gpu_failure_loses_gpu_copies_then_drops_host_copies_below_them():
    kt = lru(gpu=20, host=30)
    kt.access([1, 2], [10, 10])
    kt.access([3], [10])  # 2 is the only GPU leaf under a full GPU: it goes to host
    assert moves_of(kt)[-3:] == [("swap_out", 2), ("free_gpu", 2), ("admit_gpu", 3)]
    kt.fail_gpu()
    moves = moves_of(kt)
    assert sorted(moves[:2]) == [("fail_gpu", 1), ("fail_gpu", 3)]
    assert moves[2:] == [("drop", 2)]  # its prefix (1) is gone, so its host copy is invalid


def test_reservations_report_their_evictions_only():
    kt = lru(gpu=20, host=100)
    kt.access([1], [10])
    kt.access([2], [10])
    kt.drain_moves()
    assert kt.reserve_gpu(10)
    assert moves_of(kt) == [("swap_out", 1), ("free_gpu", 1)]
    kt.free_gpu(10)
    assert moves_of(kt) == []


def test_a_node_that_cannot_be_admitted_does_not_move():
    kt = lru(gpu=10, host=100)
    kt.access([1], [20])
    assert moves_of(kt) == [] and kt.admission_failures == 1


# ---------------------------------------------------------------- drain semantics
def test_drain_returns_what_happened_since_the_last_drain_in_order():
    kt = lru(gpu=20, host=100)
    kt.access([1], [10])
    kt.access([2], [10])
    assert kt.pending_moves == 2
    first = kt.drain_moves()
    assert [(m.kind, m.node.key) for m in first] == [("admit_gpu", 1), ("admit_gpu", 2)]
    assert kt.pending_moves == 0 and kt.drain_moves() == []
    kt.access([3], [10])
    assert moves_of(kt) == [("swap_out", 1), ("free_gpu", 1), ("admit_gpu", 3)]
    # a drained list belongs to the caller: later moves do not land in it
    assert [(m.kind, m.node.key) for m in first] == [("admit_gpu", 1), ("admit_gpu", 2)]
    node = first[0].node
    assert first[0] == ("admit_gpu", node) and first[0].node is kt.root.children[1]


def test_without_recording_nothing_is_recorded():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=20, host_capacity_bytes=100,
                       kv_bytes_per_token=1)
    for doc in [1, 2, 3, 1]:
        kt.access([doc], [10])
    assert not kt.record_moves and kt.pending_moves == 0
    with pytest.raises(ValueError, match="record_moves=True"):
        kt.drain_moves()
