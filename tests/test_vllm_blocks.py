"""Documents in vLLM's blocks (ragsim/realrun/vllm/blocks.py), worked by hand: plain arithmetic
that the ragcache connector relies on, checked without vLLM (the main suite runs it)."""

from __future__ import annotations

from ragsim.realrun.vllm.blocks import block_owners, loadable_tokens


def test_a_block_belongs_to_the_document_that_holds_its_last_token():
    # system prompt 40 tokens, documents of 100 and 30, blocks of 32:
    # block 0 [0, 32) ends in the prompt; block 1 [32, 64) ends in doc A (40-140), as do
    # block 2 [64, 96) and block 3 [96, 128); block 4 [128, 160) ends in doc B (140-170);
    # block 5 [160, 192) would end past B: not whole, nobody's
    spans = [(0, 40), (40, 140), (140, 170)]
    assert block_owners(spans, 32) == [0, 1, 1, 1, 2]


def test_short_documents_may_own_no_block():
    # a 10-token document inside block 1 owns nothing; the block straddling it and the next
    # document is the next one's (its KV depends on both)
    spans = [(0, 32), (32, 42), (42, 100)]
    assert block_owners(spans, 32) == [0, 2, 2]
    assert block_owners([(0, 0), (0, 31)], 32) == []  # no whole block at all
    assert block_owners([(0, 0), (0, 32)], 32) == [1]  # the root (empty) owns none


def test_one_nodes_own_blocks_away_from_token_zero():
    assert len(block_owners([(40, 140)], 32)) == 3  # blocks ending at 64, 96, 128
    assert len(block_owners([(64, 100)], 32)) == 1  # 96; the block ending at 64 is not its
    assert len(block_owners([(64, 96)], 32)) == 1


def test_loads_are_whole_blocks_and_never_the_last_token():
    assert loadable_tokens(170, 300, 32) == 160  # 5 whole blocks of the cached 170
    assert loadable_tokens(128, 300, 32) == 128
    assert loadable_tokens(31, 300, 32) == 0
    # everything cached: the last token is computed, so its block is too
    assert loadable_tokens(128, 128, 32) == 96
    assert loadable_tokens(200, 129, 32) == 128
