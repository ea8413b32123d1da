"""How an engine that keeps its running requests in one padded batch lays out a decode step,
and so how many tokens the step attends over.

The torch engine (``ragsim/realrun/iterations.py``) keeps its decode batch as one tensor per
layer: every row's KV left-padded to a common end, in a buffer with a quarter more rows
(``DECODE_HEADROOM_ROWS`` at least) and ``DECODE_HEADROOM_TOKENS`` of room. The batch changes in
place when a request leaves or a request no longer than the common end joins. It is rebuilt,
its end reset to its longest row, when it cannot (a joiner longer than that end, more rows
than the buffer holds), when no row of the last step stays (the rebuild then copies only the
joiners, as a change in place would) and when its end is more than ``REBUILD_PADDING_FACTOR``
times its longest row (a long request left: the copy of the rows costs about one step's reads
of them, the padding it removes is read by every later step). So a step computes every row
over the common end, not over its own context.

Measured (``benchmarks/decode_rows.py padded``: ``decode_paths.py``'s two paths, 2 layers x 256
hidden, one CPU thread, 2026-12-04): 40 rows of 284 tokens on average, padded to 1,500 and 3,000
tokens, took 38.6 and 58.6 ms a step; a batch of 40 rows of 284 tokens each took 21.5 ms, one of
40 rows of 1,500 or 3,000 tokens 39.8 and 61.6 ms. A padded step costs what a uniform batch at
its end costs, which the decode grid measures; priced at the rows' mean context, the torch
engine's decode steps ran 2-6x their price at overload and 1.33x at 50% load (run W,
docs/validation.md). Before the last two reasons to rebuild, the end only ever grew within a run
(at 50% load it averaged 1,134 tokens over a run's 500 decode steps, rows of about 250 tokens
decoded over 550-770).

``PaddedDecodeBatch`` is that rule in one place: the engine asks it whether a step rebuilds the
batch, the simulator asks it where the step ends, so both lay out the same batch. A paged engine
(vLLM) pads nothing: its profiles' ``decode_padding`` is ``"none"`` and its steps are priced at
the mean context.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable

# a profile's ``decode_padding``: "none" (paged: each row over its own context) or
# "common_end" (one padded batch, ``PaddedDecodeBatch``)
DECODE_PADDINGS = ("none", "common_end")

# room a rebuilt decode batch keeps for the tokens still to come (then it grows as a full
# GrowingLayer does: ``grown_tokens``)
DECODE_HEADROOM_TOKENS = 64
# and for rows that join later (at least this many, or a quarter more)
DECODE_HEADROOM_ROWS = 4
GROWTH_EXTRA_TOKENS = 64
# a batch whose common end is more than this many times its longest row is rebuilt
REBUILD_PADDING_FACTOR = 2


def grown_tokens(tokens: int) -> int:
    """The tokens a full ``GrowingLayer`` buffer of ``tokens`` grows to (the memory bound and
    the layout read it here too)."""
    return tokens + tokens // 4 + GROWTH_EXTRA_TOKENS


def decode_buffer_shape(rows: int, longest_tokens: int) -> tuple[int, int]:
    """A rebuilt decode batch's buffer (rows, tokens) for ``rows`` requests padded to
    ``longest_tokens``: a quarter more rows (at least DECODE_HEADROOM_ROWS) for joiners, and
    DECODE_HEADROOM_TOKENS for the tokens to come. The engine, its memory bound
    (``realrun.memory``), the layout and ``benchmarks/decode_paths.py`` all read it here."""
    return rows + max(DECODE_HEADROOM_ROWS, rows // 4), longest_tokens + DECODE_HEADROOM_TOKENS


class PaddedDecodeBatch:
    """The rows of one padded decode batch, where their KV ends and the buffer that holds them.

    ``plan`` lays out a step of a set of running requests (rebuilt or changed in place) and
    ``advance`` notes that steps ran (each row took a token; a full buffer grew by a quarter,
    keeping only the rows it held then, as ``GrowingLayer`` grows). ``end_tokens`` is where
    every row's KV ends: a step computes each row over that many tokens. Tokens are counted in
    the caller's frame (the engine: a row's KV; the simulator: its context, one more), the same
    for every row, so both frames take the same decisions."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No batch (the engine's first step, or a lost GPU's)."""
        # a row's tokens minus the steps counted when it was noted: its tokens now are this
        # plus ``_steps``
        self._offsets: dict[Hashable, int] = {}
        self._steps = 0
        self.end_tokens = 0
        self.buffer_rows = 0
        self.buffer_tokens = 0
        self.written_rows = 0
        self.written_row_tokens = 0

    @property
    def rows(self) -> int:
        return len(self._offsets)

    def unchanged(self, members: Collection[Hashable]) -> bool:
        """Whether ``members`` are the rows that ran the last step."""
        offsets = self._offsets
        return bool(offsets) and len(members) == len(offsets) and all(
            m in offsets for m in members)

    def plan(self, members: Collection[Hashable], tokens: Callable[[Hashable], int]) -> bool:
        """Lays out a step of ``members`` (``tokens(m)``: a joining request's tokens now; the
        rows that ran the last step are followed here) and says whether the batch is rebuilt
        for it. ``end_tokens`` is then the step's padded length, ``written_rows`` the rows the
        change writes into the batch and ``written_row_tokens`` their tokens (``batch_copy``: a
        rebuild writes every row to the new end; a change in place the joiners and, for each
        row that left, the last row moved into its place, counted here as if it were never the
        last: the engine counts the moves it made); 0 when the rows are the last step's."""
        offsets, steps = self._offsets, self._steps
        self.written_rows = self.written_row_tokens = 0
        if self.unchanged(members):
            return False
        now = {m: offsets[m] + steps if m in offsets else tokens(m) for m in members}
        longest = max(now.values())
        rebuild = (not self.buffer_rows or len(now) > self.buffer_rows
                   or longest > self.end_tokens  # a joiner longer than the end
                   or not any(m in offsets for m in now)
                   or self.end_tokens > REBUILD_PADDING_FACTOR * longest)
        if rebuild:
            self.end_tokens = longest
            self.buffer_rows, self.buffer_tokens = decode_buffer_shape(len(now), longest)
            self.written_rows = len(now)
        else:
            joined = sum(1 for m in now if m not in offsets)
            left = sum(1 for m in offsets if m not in now)
            self.written_rows = joined + left
        self.written_row_tokens = self.written_rows * self.end_tokens
        self._offsets = {m: t - steps for m, t in now.items()}
        return rebuild

    def advance(self, steps: int = 1) -> None:
        """``steps`` decode steps of the planned rows ran: each row's KV, and the common end,
        took a token a step; a full buffer grew to ``grown_tokens`` of itself, holding only
        the rows that ran then."""
        self._steps += steps
        self.end_tokens += steps
        while self.end_tokens > self.buffer_tokens:
            self.buffer_tokens = grown_tokens(self.buffer_tokens)
            self.buffer_rows = len(self._offsets)
