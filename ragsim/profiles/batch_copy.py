"""What a padded decode batch costs to lay out: the rows it writes when it changes.

The torch engine keeps its running requests in one padded batch (``decode_layout``). A decode
step that changes the batch first writes rows into it: a rebuild writes every row to the common
end (the rows that stay copied from the old buffer, the joiners from their own KV, zeros where
rows are padded), a change in place writes the joiners and the rows moved into a leaver's hole.
Only then does it run its forward pass, which the decode grid prices. Nothing priced the writes:
on the project's 2-core CPU (2026-12-07, run AG in docs/validation.md: 2 layers x 256 hidden,
fp32, one thread, the held-out trace) the engine's changed decode steps ran 1.09x their price at
one row and 1.16-1.44x at 4-60 rows, and without their writes 0.98-1.00x and 0.84-1.11x; a write
cost about 0.8 ms for a row and 230-260 ns a row-token (2 KiB) from a few thousand row-tokens
up. (A process's first write of a new, much larger batch pays more, once: 0.95-3.74 s for the
first 256 rows at overload, its memory growing; this term does not price that.)

``BatchCopy`` is that cost, ``latency_s + rows * s_per_row + row_tokens * s_per_row_token``,
fitted by least squares (every term >= 0, weighted by 1/time so that small and large writes
count alike) to the engine's own rebuild (``torch_model.joiners_decode_cache``) timed by the
profiler at a few rows x tokens (``TorchEngine.batch_copy``). A row costs apart from its tokens
(the write loops over rows and layers): the profiler's first timings of it (2026-12-07, the
same model) put 64 rows of 128 tokens at 4.1-4.3 ms and 4 rows of 2,048 (as many row-tokens)
at 1.7-2.5 ms; fitted on row-tokens alone their median error was 18% (at most 59%), with a
term per row 9% (at most 34%). The simulator follows the batch by the engine's
rule (``PaddedDecodeBatch.written_row_tokens``) and charges it to every decode step that
changes the batch; the replay of a real run charges the rows the engine recorded writing
(``batch_row_tokens``). A paged engine (vLLM) writes no batch: its profiles have no term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ragsim.errors import ProfileError

BATCH_COPY_MODEL = "latency_plus_rows_and_row_tokens_written"


@dataclass(frozen=True)
class BatchCopy:
    latency_s: float
    s_per_row: float
    s_per_row_token: float
    fit: dict = field(default_factory=dict)  # what it was fitted to: the timings, the errors

    def seconds(self, rows: int, row_tokens: float) -> float:
        """A change of the batch that writes ``rows`` rows, ``row_tokens`` in all (each row to
        the batch's end); 0 for none."""
        if rows <= 0:
            return 0.0
        return self.latency_s + rows * self.s_per_row + row_tokens * self.s_per_row_token

    def describe(self) -> str:
        return (f"a changed decode batch's write: {self.latency_s * 1e3:.3g} ms + "
                f"{self.s_per_row * 1e6:.3g} us a row + {self.s_per_row_token * 1e9:.3g} ns a "
                "row-token")

    def to_dict(self) -> dict:
        return {"model": BATCH_COPY_MODEL, "latency_s": self.latency_s,
                "s_per_row": self.s_per_row, "s_per_row_token": self.s_per_row_token,
                "fit": self.fit}


def batch_copy_from_dict(data: object, *, source: str) -> BatchCopy:
    where = "batch_copy"
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field=where)
    if data.get("model") != BATCH_COPY_MODEL:
        raise ProfileError(f"model must be {BATCH_COPY_MODEL!r}, got {data.get('model')!r}",
                           file=source, field=f"{where}.model")
    values = {}
    for key in ("latency_s", "s_per_row", "s_per_row_token"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < 0:
            raise ProfileError(f"must be a finite number >= 0, got {value!r}", file=source,
                               field=f"{where}.{key}")
        values[key] = float(value)
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    return BatchCopy(values["latency_s"], values["s_per_row"], values["s_per_row_token"], fit)


def fit_batch_copy(rows: list[list[float]]) -> BatchCopy:
    """``BatchCopy`` from ``[rows, tokens, seconds]`` timings of the engine's rebuild (one per
    repeat): least squares of seconds on (1, rows, rows x tokens), every coefficient >= 0,
    weighted by 1/seconds (relative errors, so the one-row writes are not drowned by the
    large)."""
    from ragsim.profiles.fitting import relative_nnls

    design = [[1.0, r[0], r[0] * r[1]] for r in rows]
    (latency, per_row, per_row_token), errors = relative_nnls(design, [r[2] for r in rows])
    return BatchCopy(float(latency), float(per_row), float(per_row_token), {
        "statistic": "least squares of each timing on (1, rows, rows x tokens), every term "
                     ">= 0, weighted by 1 / seconds",
        "timings": [[int(r[0]), int(r[1]), float(r[2])] for r in rows],
        "median_abs_rel_error": float(np.median(errors)),
        "max_abs_rel_error": float(np.max(errors))})
