"""Measure staged IVF search at the paper's knowledge-base scale on this CPU.

RAGCache's knowledge base is ~300k Wikipedia passages embedded in 768 dimensions, searched with
an IVF index of 1,024 lists (DESIGN.md). The simulator's ``search_s`` default stands for one such
search on one core. This script builds that index over random unit vectors (scan time depends on
how many vectors are read, not on what they mean; k-means runs few iterations because list
quality does not change the time of a scan), then times single-query, single-thread staged
searches (``ragsim.traces.corpus.search.StagedIndex``, the code ``ragsim trace build`` records
traces with) at several ``nprobe``, and prints the mean and p99 per search and per stage, and
the scan rate, from which any other index size can be scaled (``--search-time-scale``).

    python benchmarks/retrieval_latency.py                  # ~3 minutes, ~1.5 GB of memory
    python benchmarks/retrieval_latency.py --documents 50000 --queries 100   # quick
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import faiss

    from ragsim.traces.corpus.search import IndexSpec, StagedIndex

    rng = np.random.default_rng(args.seed)
    vectors = rng.standard_normal((args.documents, args.dim), dtype=np.float32)
    faiss.normalize_L2(vectors)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    faiss.normalize_L2(queries)
    spec = IndexSpec(kind="ivf", nlist=args.nlist, nprobe=args.nlist, stages=args.stages)
    index = StagedIndex(vectors, spec, seed=args.seed, kmeans_iterations=4)
    rows = []
    for nprobe in args.nprobe:
        index.spec = IndexSpec(kind="ivf", nlist=args.nlist, nprobe=nprobe,
                               stages=min(args.stages, nprobe)).resolved(args.documents)
        index.index.nprobe = nprobe
        result = index.search(queries, args.top_k)
        per_search = result.stage_times_s.sum(axis=1)
        scanned_bytes = args.documents * nprobe / args.nlist * args.dim * 4
        rows.append({
            "nprobe": nprobe,
            "search_mean_s": float(per_search.mean()),
            "search_p50_s": float(np.median(per_search)),
            "search_p99_s": float(np.percentile(per_search, 99)),
            "stage_mean_s": [float(t) for t in result.stage_times_s.mean(axis=0)],
            "scan_gb_per_s": scanned_bytes / float(per_search.mean()) / 1e9,
        })
    report = {"documents": args.documents, "dim": args.dim, "nlist": args.nlist,
              "queries": args.queries, "stages": args.stages, "build_s": index.build_s,
              "measured_on": "one query at a time, one thread", "results": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"IVF{args.nlist}, {args.documents:,} x {args.dim}-d vectors (built in "
          f"{index.build_s:.0f} s), {args.queries} queries, one thread:")
    print(f"{'nprobe':>7} {'mean ms':>9} {'p50 ms':>8} {'p99 ms':>8} {'GB/s':>6}  stages (ms)")
    for r in rows:
        stages = " ".join(f"{t * 1e3:.2f}" for t in r["stage_mean_s"])
        print(f"{r['nprobe']:>7} {r['search_mean_s'] * 1e3:>9.2f} {r['search_p50_s'] * 1e3:>8.2f}"
              f" {r['search_p99_s'] * 1e3:>8.2f} {r['scan_gb_per_s']:>6.2f}  {stages}")


if __name__ == "__main__":
    main()
