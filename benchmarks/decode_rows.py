"""The torch decode step's price questions, on the profile's own decode path
(``TorchModel.decode`` then ``undo_decode``, as ``benchmarks/decode_paths.py``'s profiler path).

docs/profiles.md quotes three tables from it (2 layers x 256 hidden, fp32, one thread):

* ``rows``: a step of 1-16 rows at 300 and 1,000 tokens. On this project's CPU 2-3 rows ran
  slower than 4 (the grid keeps its batch axis as measured: ``batch_sizes_monotone``);
* ``cold``: the profiler's decode cells timed twice in a new process, the first pass against
  the second (why each cell now runs once untimed first);
* ``padded``: rows of a mean context padded to a longer common end (the torch engine's batch,
  ``decode_layout.PaddedDecodeBatch``), against uniform batches at the mean and at the end.

    LD_PRELOAD=libtcmalloc_minimal.so.4 python benchmarks/decode_rows.py cold  # first, fresh
    LD_PRELOAD=libtcmalloc_minimal.so.4 python benchmarks/decode_rows.py rows padded
"""

from __future__ import annotations

import argparse

from decode_paths import engine_path, profiler_path

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.profiles.profiler import TorchEngine
from ragsim.profiles.torch_model import TorchModel

CELLS = [(1, 128), (1, 2048), (2, 128), (2, 2048), (3, 128), (3, 2048), (4, 128), (4, 2048),
         (64, 128), (64, 2048)]


def rows_table(model: TorchModel) -> None:
    print("| context | " + " | ".join(f"{r} rows" for r in (1, 2, 3, 4, 5, 6, 8, 12, 16))
          + " |  (ms a step, median of 15)")
    for context in (300, 1000):
        print(f"| {context} | " + " | ".join(
            f"{profiler_path(model, r, context, 15) * 1e3:.2f}"
            for r in (1, 2, 3, 4, 5, 6, 8, 12, 16)) + " |")


def cold_table(spec) -> None:
    """Must run first in its process: the profiler's engine, its decode cells timed twice."""
    engine = TorchEngine(spec, "cpu", "fp32", 1, 0)
    passes = [[engine.decode(b, c, 1, 7).median_s for b, c in CELLS] for _ in range(2)]
    print("| rows | context | first pass (ms) | second pass (ms) | first / second |")
    for (b, c), first, second in zip(CELLS, *passes, strict=True):
        print(f"| {b} | {c} | {first * 1e3:.2f} | {second * 1e3:.2f} | {first / second:.2f} |")


def padded_table(model: TorchModel) -> None:
    print("| rows | mean context | common end | padded batch | all at the mean | all at the end |")
    for rows, mean, end in ((40, 284, 284), (40, 284, 1500), (40, 284, 3000),
                            (128, 250, 2500), (256, 250, 2500)):
        rest = max(1, round((mean * rows - end) / (rows - 1)))  # one row at the end
        padded = engine_path(model, [end] + [rest] * (rows - 1), 5)
        at_mean, at_end = profiler_path(model, rows, mean, 5), profiler_path(model, rows, end, 5)
        print(f"| {rows} | {mean} | {end} | {padded * 1e3:.1f} | {at_mean * 1e3:.1f} | "
              f"{at_end * 1e3:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", choices=("rows", "cold", "padded"))
    args = parser.parse_args()
    spec = scaled_down(resolve_model("mistral-7b"), layers=2, hidden=256).with_dtype("fp32")
    if "cold" in args.tables:
        cold_table(spec)
    model = TorchModel(spec, device="cpu", dtype="fp32", threads=1)
    if "rows" in args.tables:
        rows_table(model)
    if "padded" in args.tables:
        padded_table(model)


if __name__ == "__main__":
    main()
