"""Model architectures, from which the KV-cache footprint per token follows.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element. Taking it
from the architecture rather than from a user-typed constant is what makes LLaMA2-7B's KV four
times Mistral-7B's (multi-head vs grouped-query attention), which the paper's results hinge on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ragsim.errors import RagsimInputError

DTYPE_BYTES = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "float8": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a transformer's architecture that size its KV cache and its compute."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "fp16"
    num_experts: int = 1
    experts_per_token: int = 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def with_dtype(self, dtype: str) -> ModelSpec:
        if dtype not in DTYPE_BYTES:
            raise RagsimInputError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
        return ModelSpec(**{**asdict(self), "dtype": dtype})

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_bytes_per_token": self.kv_bytes_per_token}


# Architectures from the models' published configurations (config.json of each release).
BUILTIN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mistral-7b", 32, 32, 8, 128, 4096, 14336, 32000),
        ModelSpec("llama2-7b", 32, 32, 32, 128, 4096, 11008, 32000),
        ModelSpec("llama2-13b", 40, 40, 40, 128, 5120, 13824, 32000),
        ModelSpec("llama3-8b", 32, 32, 8, 128, 4096, 14336, 128256),
        ModelSpec("mixtral-8x7b", 32, 32, 8, 128, 4096, 14336, 32000, num_experts=8,
                  experts_per_token=2),
        ModelSpec("llama2-70b", 80, 64, 8, 128, 8192, 28672, 32000),
    )
}


def scaled_down(spec: ModelSpec, *, layers: int | None = None, hidden: int | None = None
                ) -> ModelSpec:
    """A smaller model of the same architecture, for profiling on a CPU.

    Head dimension stays as is; heads, KV heads (keeping the GQA ratio) and the MLP width scale
    with the hidden size. The name records what was changed.
    """
    if layers is not None and layers <= 0:
        raise RagsimInputError("must be > 0", field="--layers")
    if hidden is not None and (hidden <= 0 or hidden % spec.head_dim):
        raise RagsimInputError(f"must be a positive multiple of the head dim {spec.head_dim}",
                               field="--hidden")
    new_layers = layers or spec.num_layers
    new_hidden = hidden or spec.hidden_size
    heads = max(1, new_hidden // spec.head_dim)
    group = max(1, spec.num_attention_heads // spec.num_kv_heads)
    kv_heads = max(1, heads // group)
    intermediate = max(1, round(spec.intermediate_size * new_hidden / spec.hidden_size))
    tag = f"{spec.name}-l{new_layers}-h{new_hidden}"
    return ModelSpec(tag, new_layers, heads, kv_heads, spec.head_dim, new_hidden, intermediate,
                     spec.vocab_size, spec.dtype, spec.num_experts, spec.experts_per_token)


def spec_from_hf_config(config: dict, *, name: str, source: str = "<config>") -> ModelSpec:
    """Build a spec from a Hugging Face style ``config.json`` dictionary."""

    def need(key: str) -> int:
        if key not in config:
            raise RagsimInputError("missing key in model config", file=source, field=key)
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise RagsimInputError(
                f"expected a positive integer, got {value!r}", file=source, field=key
            )
        return value

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    if dtype not in DTYPE_BYTES:
        raise RagsimInputError(f"unknown dtype {dtype!r}", file=source, field="torch_dtype")
    return ModelSpec(
        name=name,
        num_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        hidden_size=hidden,
        intermediate_size=int(config.get("intermediate_size") or 4 * hidden),
        vocab_size=int(config.get("vocab_size") or 32000),
        dtype={"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype),
        num_experts=int(config.get("num_local_experts") or 1),
        experts_per_token=int(config.get("num_experts_per_tok") or 1),
    )


def resolve_model(name_or_path: str) -> ModelSpec:
    """A built-in name (``mistral-7b``) or a path to a Hugging Face ``config.json``."""
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RagsimInputError(f"not valid JSON: {exc}", file=str(path)) from exc
        return spec_from_hf_config(config, name=path.parent.name or path.stem, source=str(path))
    raise RagsimInputError(
        f"unknown model {name_or_path!r}: use one of {sorted(BUILTIN_MODELS)} "
        "or a path to a Hugging Face config.json"
    )
