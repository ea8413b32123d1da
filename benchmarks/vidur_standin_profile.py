"""Write a stand-in ``attention.csv`` so that a Vidur source checkout runs without its GPU profile.

Vidur predicts each batch's time from profiling tables it reads relative to its working
directory: ``data/profiling/compute/{DEVICE}/{MODEL}/mlp.csv`` and ``attention.csv``, and the
network tables. A checkout whose ``attention.csv`` files are missing (they are large; snapshots
of the repository may leave them out) stops when its execution-time predictor starts. This
script writes that one file, in the schema of Vidur's attention profiler, so that Vidur's own
code runs end to end: it trains its random-forest predictors on this table, as on a measured
one, and simulates with them.

THE TIMES ARE NOT MEASURED. They come from a roofline formula (below). Vidur's simulation
speed, the wall time it takes per simulated request, does not depend on these values beyond
their effect on how requests batch, so the table is good for timing Vidur, and for nothing that
reads its simulated latencies.

Schema (what Vidur's sklearn predictor reads): one row per profiled input, with columns

- ``time_stats.{attn_prefill,attn_decode,attn_kv_cache_save}.{min,max,mean,median,std}`` in
  milliseconds, per layer and per tensor-parallel worker; the predictor trains on ``median``
  (``attn_prefill`` on prefill rows with features ``kv_cache_size`` and
  ``prefill_chunk_size**2``; ``attn_decode`` on decode rows with ``batch_size`` and
  ``kv_cache_size``; ``attn_kv_cache_save`` on all rows with ``max(prefill_chunk_size,
  batch_size)``). A prefill row leaves ``attn_decode`` empty and a decode row ``attn_prefill``,
  as the profiler does; all five statistics hold the one formula value (``std`` 0).
- ``n_embd``, ``n_q_head``, ``n_kv_head``, ``block_size``, ``num_tensor_parallel_workers``:
  the predictor keeps the rows equal to the simulated model and replica (whole-model head
  counts, not per worker); ``max_model_len``, ``batch_size``, ``prefill_chunk_size``,
  ``kv_cache_size``, ``is_prefill``, ``attention_backend`` as the profiler writes them.
- ``stand_in``: ``formula`` on every row, so that a stand-in table can be told from a measured
  one (Vidur ignores the column).

Grid: the inputs Vidur's attention profiler enumerates for ``max_seq_len`` 4096 and decode batch
sizes 1-128: chunked prefills (chunk sizes 64-4096, the KV-cache sizes being the multiples of
the chunk below ``max_seq_len - chunk + 1``), full prefills of 32-4032 tokens, and decodes of
every batch size 1-128 at KV-cache sizes 32-4032; the profiler's GPU-memory cut is not applied.
One copy per tensor-parallel degree found in the same folder's ``mlp.csv`` (else ``--tp``).

Formula, per layer and worker (h = head_dim, q = query heads / tp, k = KV heads / tp, 2-byte
elements; peak dense fp16 FLOP/s and HBM bandwidth of the device, at 50% and 70% efficiency):

- prefill: 20 us + max(4 q h c (kv + c/2) / flops, 2 k h (kv + c) 2 / bandwidth), for chunk c
  on top of kv cached tokens (causal attention);
- decode: 20 us + max(4 q h b kv / flops, 2 k h b kv 2 / bandwidth), for b sequences of kv
  tokens;
- KV-cache save: 5 us + 2 k h n 2 2 / bandwidth for n = max(chunk, batch) new tokens (read and
  write).

The model's shape (``n_embd``, ``n_head``, ``n_kv_head``) is read from the ``mlp.csv`` beside
the file written, or given with ``--n-embd``/``--n-q-head``/``--n-kv-head``. The output is
deterministic.

    python benchmarks/vidur_standin_profile.py VIDUR_ROOT [--device a100]
        [--model meta-llama/Llama-2-7b-hf]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

# peak dense fp16 tensor FLOP/s and HBM bytes/s
DEVICES = {"a100": (312e12, 2.0e12), "h100": (989e12, 3.35e12), "a40": (150e12, 0.696e12)}
FLOP_EFFICIENCY = 0.5
BANDWIDTH_EFFICIENCY = 0.7
ELEMENT_BYTES = 2
FIXED_MS = {"attn_prefill": 0.020, "attn_decode": 0.020, "attn_kv_cache_save": 0.005}
STATS = ("min", "max", "mean", "median", "std")
OPS = ("attn_kv_cache_save", "attn_prefill", "attn_decode")
META = ("n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
        "max_model_len", "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
        "attention_backend", "stand_in")


def input_grid(max_seq_len: int, max_batch_size: int) -> list[tuple[int, int, int, bool]]:
    """(prefill_chunk_size, kv_cache_size, batch_size, is_prefill), as Vidur's profiler
    enumerates them."""
    chunks = (list(range(64, 129, 16)) + list(range(128, 1025, 32))
              + list(range(1024, 4 * 1024 + 1, 64)) + list(range(4 * 1024, 16 * 1024 + 1, 128))
              + list(range(16 * 1024, 64 * 1024 + 1, 256)))
    lengths = [n for n in (list(range(0, 1025, 32)) + list(range(1024, 4 * 1024 + 1, 64))
                           + list(range(4 * 1024, 64 * 1024 + 1, 256))) if n < max_seq_len]
    grid: list[tuple[int, int, int, bool]] = []
    for chunk in (c for c in chunks if c <= max_seq_len):
        grid += [(chunk, i * chunk, 1, True) for i in range(max_seq_len // chunk)]
    grid += [(n, 0, 1, True) for n in lengths]
    grid += [(0, kv, b, False) for kv in lengths for b in range(1, max_batch_size + 1)]
    seen: set[tuple[int, int, int, bool]] = set()
    valid = []
    for chunk, kv, batch, prefill in grid:
        ok = (chunk > 0 and chunk + kv <= max_seq_len) if prefill else (0 < kv <= max_seq_len)
        if ok and (chunk, kv, batch, prefill) not in seen:
            seen.add((chunk, kv, batch, prefill))
            valid.append((chunk, kv, batch, prefill))
    return valid


def times_ms(device: str, n_embd: int, n_q: int, n_kv: int, tp: int, chunk: int, kv: int,
             batch: int, prefill: bool) -> dict[str, float]:
    flops, bandwidth = DEVICES[device]
    flops *= FLOP_EFFICIENCY
    bandwidth *= BANDWIDTH_EFFICIENCY
    head_dim = n_embd // n_q
    q_width = n_q // tp * head_dim
    kv_width = n_kv // tp * head_dim
    new_tokens = max(chunk, batch)
    out = {"attn_kv_cache_save": FIXED_MS["attn_kv_cache_save"]
           + 1e3 * 2 * kv_width * new_tokens * ELEMENT_BYTES * 2 / bandwidth}
    if prefill:
        compute = 4 * q_width * chunk * (kv + chunk / 2) / flops
        memory = 2 * kv_width * (kv + chunk) * ELEMENT_BYTES / bandwidth
        out["attn_prefill"] = FIXED_MS["attn_prefill"] + 1e3 * max(compute, memory)
    else:
        compute = 4 * q_width * batch * kv / flops
        memory = 2 * kv_width * batch * kv * ELEMENT_BYTES / bandwidth
        out["attn_decode"] = FIXED_MS["attn_decode"] + 1e3 * max(compute, memory)
    return out


def model_shape(mlp_csv: Path) -> tuple[int, int, int, list[int]]:
    with mlp_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    shapes = {(int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])) for r in rows}
    if len(shapes) != 1:
        raise SystemExit(f"{mlp_csv}: expected one model shape, found {sorted(shapes)}")
    tps = sorted({int(r["num_tensor_parallel_workers"]) for r in rows})
    return (*shapes.pop(), tps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vidur_root", type=Path, help="Vidur source folder (holds ./data)")
    parser.add_argument("--device", default="a100", choices=sorted(DEVICES))
    parser.add_argument("--model", default="meta-llama/Llama-2-7b-hf")
    parser.add_argument("--n-embd", type=int, help="default: from the model's mlp.csv")
    parser.add_argument("--n-q-head", type=int, help="default: from the model's mlp.csv")
    parser.add_argument("--n-kv-head", type=int, help="default: from the model's mlp.csv")
    parser.add_argument("--tp", type=int, nargs="+",
                        help="tensor-parallel degrees (default: those in mlp.csv)")
    parser.add_argument("--block-size", type=int, nargs="+", default=[16],
                        help="paged-attention block sizes (Vidur's scheduler default: 16)")
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--force", action="store_true",
                        help="overwrite an attention.csv that is not a stand-in")
    args = parser.parse_args()

    folder = args.vidur_root / "data" / "profiling" / "compute" / args.device / args.model
    out = folder / "attention.csv"
    mlp = folder / "mlp.csv"
    if mlp.exists():
        n_embd, n_q, n_kv, tps = model_shape(mlp)
    elif None in (args.n_embd, args.n_q_head, args.n_kv_head):
        raise SystemExit(f"{mlp} not found: give --n-embd, --n-q-head and --n-kv-head")
    else:
        n_embd, n_q, n_kv, tps = 0, 0, 0, [1]
    n_embd = args.n_embd or n_embd
    n_q = args.n_q_head or n_q
    n_kv = args.n_kv_head or n_kv
    tps = [tp for tp in (args.tp or tps) if n_q % tp == 0 and n_kv % tp == 0]
    if out.exists() and not args.force:
        with out.open(newline="") as f:
            header = next(csv.reader(f), [])
        if "stand_in" not in header:
            raise SystemExit(f"{out} exists and is not a stand-in; --force to overwrite")

    grid = input_grid(args.max_seq_len, args.max_batch_size)
    columns = [f"time_stats.{op}.{s}" for op in OPS for s in STATS] + list(META)
    folder.mkdir(parents=True, exist_ok=True)
    n_rows = 0
    with out.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        for tp in tps:
            for block_size in args.block_size:
                for chunk, kv, batch, prefill in grid:
                    t = times_ms(args.device, n_embd, n_q, n_kv, tp, chunk, kv, batch, prefill)
                    row = []
                    for op in OPS:
                        value = t.get(op)
                        if value is None:
                            row += [""] * len(STATS)
                        else:
                            v = f"{value:.6g}"
                            row += [v, v, v, v, "0.0"]
                    row += [n_embd, n_q, n_kv, block_size, tp, args.max_seq_len, batch, chunk,
                            kv, prefill, "flashinfer", "formula"]
                    writer.writerow(row)
                    n_rows += 1
    print(f"wrote {n_rows:,} stand-in rows (tp {tps}, n_embd {n_embd}, heads {n_q}/{n_kv}) "
          f"to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
