"""How much faster a blended prefill is than a full one on the torch engine, measured in one run.

A context is a system prompt (the exact prefix, cached), ``D`` documents of ``T`` tokens each
and a query. The documents' KV was computed elsewhere (each alone, at position 0) and is moved
into place (``ragsim.realrun.blend``). Timed, best of ``--repeats`` after one warm-up, on this
machine's model (random weights, a scaled-down Mistral-7B by default):

* ``full``: the prefill of everything after the system prompt over its cached KV
  (``TorchModel.prefill``, the prefix cache's path);
* ``blend:R``: CacheBlend (the selection pass over the reused tokens through layer 1, then the
  query and the ``ceil(R x T)`` highest-deviation tokens of each document at the other layers);
* ``epic:K``: EPIC (the query and the first ``K`` tokens of each document at every layer).

Printed per shape: the tokens each computes at the last layer, the seconds, and ``full`` /
each (the speed-up). Then the selection pass's cost per reused token
(``blend_selection_s_per_token``, the profile term). The speed-up is what *this* engine
measures; the papers' figures (trained models on GPUs) are printed beside it, labelled as
theirs. Answer quality cannot be measured with random weights.

    python benchmarks/blend_speed.py [--layers 8] [--hidden 512] [--shapes 4x256,8x128]
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from time import perf_counter

import torch

from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.torch_blend import blend_selection_s_per_token
from ragsim.profiles.torch_model import Row, TorchModel
from ragsim.realrun.blend import ReusedDocument, blended_prefill, standalone_kv

PAPERS = (
    "CacheBlend (EuroSys'25 abstract, their measurement): TTFT 2.2-3.3x lower and "
    "throughput 2.8-5x higher than full KV recompute, without compromising generation "
    "quality (1-3% drop; three open LLMs, four datasets)",
    "EPIC (ICML'25 abstract, their measurement): up to 8x better TTFT and 7x throughput "
    "over existing systems (CacheBlend among them), with negligible or no accuracy loss",
)


def timed(fn, repeats: int, model: TorchModel) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        model.sync()
        started = perf_counter()
        fn()
        model.sync()
        best = min(best, perf_counter() - started)
    return best


def shape_row(model: TorchModel, args: argparse.Namespace, system: torch.Tensor,
              system_kv: list, doc_ids: list[torch.Tensor], query: torch.Tensor) -> str:
    """One table row: the three prefills of system + documents + query, timed."""
    docs, tokens = len(doc_ids), len(doc_ids[0])
    context = torch.cat([system, *doc_ids, query])
    after = context[len(system):]
    stored = [standalone_kv(model, d, position=0) for d in doc_ids]
    starts = [len(system) + i * tokens for i in range(docs)]

    def full() -> None:
        model.prefill([Row(system_kv, after, len(system))])

    def blended(select: str, count: int):
        return lambda: blended_prefill(
            model, context, prefix_kv=system_kv, select=select,
            reused=[ReusedDocument(s, kv, count) for s, kv in zip(starts, stored, strict=True)])

    blend = blended("deviation", math.ceil(Fraction(args.ratio) * tokens))
    epic = blended("first", min(args.first, tokens))
    full_s = timed(full, args.repeats, model)
    blend_s = timed(blend, args.repeats, model)
    epic_s = timed(epic, args.repeats, model)
    # the tokens each computed at the last layer, as the blended prefills report them
    blend_tokens, epic_tokens = len(blend().computed), len(epic().computed)
    return (f"| {docs}x{tokens} | {len(after)} | {blend_tokens} | {epic_tokens} | "
            f"{full_s:.4f} | {blend_s:.4f} | {epic_s:.4f} | {full_s / blend_s:.2f}x | "
            f"{full_s / epic_s:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--shapes", default="4x256,8x128,2x512",
                        help="documents x tokens per document, comma-separated")
    parser.add_argument("--system-tokens", type=int, default=64)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--ratio", default="0.15", help="blend's recompute ratio R")
    parser.add_argument("--first", type=int, default=32, help="epic's K")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--selection-tokens", default="256,512,1024",
                        help="context lengths the selection pass is timed at")
    args = parser.parse_args()

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=args.layers,
                       hidden=args.hidden).with_dtype(args.dtype)
    model = TorchModel(spec, args.device, args.dtype, threads=args.threads, seed=0)
    generator = torch.Generator().manual_seed(0)

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, spec.vocab_size, (n,), generator=generator)

    print(f"model {spec.name} ({spec.num_layers} layers, hidden {spec.hidden_size}, "
          f"{args.dtype}) on {args.device}, random weights; system prompt "
          f"{args.system_tokens} tokens (cached), query {args.query_tokens}")
    print()
    print(f"| shape | full tokens | blend:{args.ratio} tokens | epic:{args.first} tokens | "
          f"full s | blend s | epic s | full / blend | full / epic |")
    print("|---|---|---|---|---|---|---|---|---|")
    system = ids(args.system_tokens)
    system_kv = model.prefill([Row(None, system, 0)]).new_kv[0]
    for shape in args.shapes.split(","):
        docs, tokens = (int(x) for x in shape.lower().split("x"))
        print(shape_row(model, args, system, system_kv, [ids(tokens) for _ in range(docs)],
                        ids(args.query_tokens)))
    print()
    per_token = blend_selection_s_per_token(
        model, repeats=args.repeats,
        context_tokens=[int(n) for n in args.selection_tokens.split(",")])
    print(f"blend_selection_s_per_token: {per_token:.3e} (selection pass per reused token, "
          "this machine)")
    print()
    print("Reported by the papers, not measured here:")
    for line in PAPERS:
        print(f"- {line}")


if __name__ == "__main__":
    main()
