"""Roofline-derived prefill-cost grids, for hardware we cannot measure here.

A prefill of beta new tokens on top of alpha cached ones costs, per layer, the dense matrix
multiplications of beta tokens (linear in beta) plus attention of beta queries over alpha + beta
keys (causal: beta*alpha + beta^2/2 query-key pairs). Dividing FLOPs by an effective throughput
(peak x efficiency) and adding a fixed per-iteration overhead gives T(alpha, beta). The shipped
tables record the formula, each constant and where it came from; ``ragsim profile`` (a later
issue) replaces them with measurements.
"""

from __future__ import annotations

from ragsim.profiles.costs import PrefillCostTable
from ragsim.profiles.models import ModelSpec

DEFAULT_CACHED_AXIS = [0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
DEFAULT_NEW_AXIS = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def dense_flops_per_token(model: ModelSpec) -> float:
    """2 FLOPs per weight touched by one token (attention projections, MLP of active experts)."""
    h, kv = model.hidden_size, model.num_kv_heads * model.head_dim
    attn_proj = h * h * 2 + h * kv * 2  # q, o and k, v projections
    mlp = 3 * h * model.intermediate_size * model.experts_per_token
    return 2.0 * model.num_layers * (attn_proj + mlp) + 2.0 * h * model.vocab_size


def attention_flops_per_pair(model: ModelSpec) -> float:
    """QK^T and PV: 2 x 2 x head_dim x heads per layer for one query-key pair."""
    return 4.0 * model.num_layers * model.num_attention_heads * model.head_dim


def roofline_prefill_table(
    *,
    name: str,
    model: ModelSpec,
    hardware: str,
    peak_flops: float,
    efficiency: float,
    overhead_s: float,
    sources: dict[str, str],
    cached_axis: list[int] | None = None,
    new_axis: list[int] | None = None,
) -> PrefillCostTable:
    cached_axis = cached_axis or DEFAULT_CACHED_AXIS
    new_axis = new_axis or DEFAULT_NEW_AXIS
    effective = peak_flops * efficiency
    dense = dense_flops_per_token(model)
    pair = attention_flops_per_pair(model)
    grid = [
        [
            round(overhead_s + (beta * dense + (beta * alpha + beta * beta / 2) * pair) / effective,
                  9)
            for beta in new_axis
        ]
        for alpha in cached_axis
    ]
    return PrefillCostTable(
        name=name,
        cached_tokens=[float(a) for a in cached_axis],
        new_tokens=[float(b) for b in new_axis],
        prefill_s=grid,
        metadata={
            "hardware": hardware,
            "model": model.name,
            "dtype": model.dtype,
            "obtained": {
                "kind": "derived",
                "formula": "overhead_s + (beta*dense_flops_per_token + (beta*alpha + beta^2/2)"
                "*attention_flops_per_pair) / (peak_flops*efficiency)",
                "constants": {
                    "peak_flops": peak_flops,
                    "efficiency": efficiency,
                    "overhead_s": overhead_s,
                    "dense_flops_per_token": dense,
                    "attention_flops_per_pair": pair,
                },
                "sources": sources,
            },
        },
    )


def a10g_mistral_7b() -> PrefillCostTable:
    """The paper's main setup. Calibrated so a 4,000-token prefill takes about one second."""
    from ragsim.profiles.models import BUILTIN_MODELS

    return roofline_prefill_table(
        name="a10g-mistral-7b",
        model=BUILTIN_MODELS["mistral-7b"],
        hardware="NVIDIA A10G 24GB, PCIe 4.0 x16",
        peak_flops=125e12,
        efficiency=0.47,
        overhead_s=0.010,
        sources={
            "peak_flops": "NVIDIA A10G datasheet: 125 TFLOPS dense FP16 tensor (with FP32 "
            "accumulate 62.5; the engine's kernels run FP16 accumulate for GEMMs)",
            "efficiency": "calibrated to RAGCache (arXiv 2404.12457) section 3: a prefill of "
            "about 4,000 tokens takes about one second for a 7B model on A10G",
            "overhead_s": "assumed per-iteration scheduling/launch overhead of a vLLM v0.3 "
            "engine; replaced by measurement in measured profiles",
        },
    )


SHIPPED_DERIVED = {"a10g-mistral-7b": a10g_mistral_7b}
