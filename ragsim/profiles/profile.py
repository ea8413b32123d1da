"""Profile format v1: what one (hardware, model, dtype, tensor-parallel degree, engine) costs.

A profile is one JSON file::

    {"format": "ragsim.profile", "version": 1, "name": "a10g-mistral-7b",
     "hardware": {"name": "a10g", "device": "NVIDIA A10G", "gpus": 1, ...},
     "model": {...architecture...}, "dtype": "fp16", "tensor_parallel": 1, "engine": "vllm",
     "obtained": {"kind": "derived", "formula": ..., "constants": ..., "sources": ...}
              or {"kind": "measured", "date": ..., "device": ..., "libraries": ..., ...},
     "kv_capacity_bytes": ...,        # GPU memory left for KV once weights and activations fit
     "overhead_s": ...,               # fixed cost of one engine iteration
     "prefill": {"cached_tokens": [...], "new_tokens": [...], "seconds": [[...]]},
     "batched_prefill": {"model": "separable", "per_iteration_s": ..., "per_token_s": ...,
                         "per_pair_s": ..., "fit": {...}},
     "decode": {"batch_sizes": [...], "context_tokens": [...], "seconds": [[...]]},
     "transfers": {"host_to_device_bytes_per_s": ..., "host_to_device_latency_s": ...,
                   "device_to_host_bytes_per_s": ..., "device_to_host_latency_s": ...}}

* ``prefill``: T(alpha, beta) of a single request with alpha cached and beta new tokens.
* ``batched_prefill``: one iteration that prefills several requests at once is predicted by a
  separable model, ``per_iteration_s + per_token_s * sum(beta_i) + per_pair_s *
  sum(beta_i * (alpha_i + beta_i / 2))``: the dense layers scale with the tokens of the whole
  batch, attention with each request's own query-key pairs (causal within the new tokens). It
  is fitted to measurements, and ``fit`` records its error.
* ``decode``: one decode iteration (one token for each of ``batch_size`` requests) as a function
  of batch size and context length per request.
* ``transfers``: copying KV between host and GPU memory: ``latency + bytes / bandwidth``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ragsim.atomic import write_text_atomically
from ragsim.errors import ProfileError
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.models import ModelSpec

FORMAT_NAME = "ragsim.profile"
FORMAT_VERSION = 1
_TOP_KEYS = ("format", "version", "name", "hardware", "model", "dtype", "tensor_parallel",
             "engine", "obtained", "kv_capacity_bytes", "overhead_s", "prefill",
             "batched_prefill", "decode", "transfers")


@dataclass(frozen=True)
class SeparableBatchModel:
    """Time of one iteration prefilling several requests (see the module docstring).

    ``padding`` says what the engine computes: ``"none"`` for varlen kernels (vLLM: each request
    its own tokens and pairs), ``"left"`` for engines that left-pad the batch to its longest
    cached prefix and longest new segment (the torch reference engine), where every row costs
    what the longest does.
    """

    per_iteration_s: float
    per_token_s: float
    per_pair_s: float
    fit: dict = field(default_factory=dict)
    padding: str = "none"

    def features(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]
                 ) -> tuple[float, float]:
        return batch_features(cached_tokens, new_tokens, self.padding)

    def iteration_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]) -> float:
        tokens, pairs = self.features(cached_tokens, new_tokens)
        return self.per_iteration_s + self.per_token_s * tokens + self.per_pair_s * pairs

    def to_dict(self) -> dict:
        return {"model": "separable", "padding": self.padding,
                "per_iteration_s": self.per_iteration_s, "per_token_s": self.per_token_s,
                "per_pair_s": self.per_pair_s, "fit": self.fit}


def batch_features(cached_tokens: Sequence[float], new_tokens: Sequence[float],
                   padding: str = "none") -> tuple[float, float]:
    """(tokens computed, query-key pairs computed) by one batched prefill iteration."""
    if padding == "left":
        rows = len(new_tokens)
        longest_new, longest_cached = max(new_tokens), max(cached_tokens)
        return (rows * longest_new,
                rows * longest_new * (longest_cached + longest_new / 2))
    tokens = float(sum(new_tokens))
    pairs = float(sum(b * (a + b / 2) for a, b in zip(cached_tokens, new_tokens, strict=True)))
    return tokens, pairs


@dataclass(frozen=True)
class Transfers:
    """Host <-> GPU copies of KV blocks: ``latency + bytes / bandwidth``."""

    host_to_device_bytes_per_s: float
    host_to_device_latency_s: float
    device_to_host_bytes_per_s: float
    device_to_host_latency_s: float

    def host_to_device_s(self, n_bytes: float) -> float:
        if n_bytes <= 0:
            return 0.0
        return self.host_to_device_latency_s + n_bytes / self.host_to_device_bytes_per_s

    def device_to_host_s(self, n_bytes: float) -> float:
        if n_bytes <= 0:
            return 0.0
        return self.device_to_host_latency_s + n_bytes / self.device_to_host_bytes_per_s

    def to_dict(self) -> dict:
        return {"host_to_device_bytes_per_s": self.host_to_device_bytes_per_s,
                "host_to_device_latency_s": self.host_to_device_latency_s,
                "device_to_host_bytes_per_s": self.device_to_host_bytes_per_s,
                "device_to_host_latency_s": self.device_to_host_latency_s}


@dataclass
class Profile:
    name: str
    hardware: dict
    model: ModelSpec
    dtype: str
    tensor_parallel: int
    engine: str
    obtained: dict
    kv_capacity_bytes: int
    overhead_s: float
    prefill: BilinearGrid
    batched_prefill: SeparableBatchModel
    decode: BilinearGrid
    transfers: Transfers

    # -- the questions a simulator asks ----------------------------------------------------
    def prefill_s(self, cached_tokens: float, new_tokens: float) -> float:
        return self.prefill.at(cached_tokens, new_tokens)

    def decode_s(self, batch_size: float, context_tokens: float) -> float:
        return self.decode.at(batch_size, context_tokens)

    @property
    def extrapolated_queries(self) -> int:
        return self.prefill.extrapolated_queries + self.decode.extrapolated_queries

    @property
    def kind(self) -> str:
        return str(self.obtained.get("kind", ""))

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        model = self.model.to_dict()
        model.pop("kv_bytes_per_token", None)
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "hardware": self.hardware,
            "model": model,
            "dtype": self.dtype,
            "tensor_parallel": self.tensor_parallel,
            "engine": self.engine,
            "obtained": self.obtained,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "overhead_s": self.overhead_s,
            "prefill": self.prefill.to_dict(),
            "batched_prefill": self.batched_prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "transfers": self.transfers.to_dict(),
        }

    def save(self, path: str | Path) -> Path:
        return write_text_atomically(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<profile>") -> Profile:
        if not isinstance(data, dict):
            raise ProfileError("expected a JSON object", file=source)
        if data.get("format") != FORMAT_NAME:
            raise ProfileError(f"expected {FORMAT_NAME!r}, got {data.get('format')!r}",
                               file=source, field="format")
        if data.get("version") != FORMAT_VERSION:
            raise ProfileError(f"unsupported version {data.get('version')!r}; this ragsim "
                               f"reads version {FORMAT_VERSION}", file=source, field="version")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise ProfileError(f"unknown key(s) {unknown}", file=source, field=unknown[0])
        for key in _TOP_KEYS:
            if key not in data:
                raise ProfileError("missing", file=source, field=key)
        name = str(data["name"])
        model = _model(data["model"], name, source)
        tp = _number(data, "tensor_parallel", source, integer=True, minimum=1)
        return cls(
            name=name,
            hardware=_object(data, "hardware", source),
            model=model,
            dtype=str(data["dtype"]),
            tensor_parallel=int(tp),
            engine=str(data["engine"]),
            obtained=_object(data, "obtained", source),
            kv_capacity_bytes=int(_number(data, "kv_capacity_bytes", source, integer=True)),
            overhead_s=_number(data, "overhead_s", source),
            prefill=BilinearGrid.from_dict(data["prefill"], name=name, x_name="cached_tokens",
                                           y_name="new_tokens", source=source,
                                           field="prefill"),
            batched_prefill=_batched(data["batched_prefill"], source),
            decode=BilinearGrid.from_dict(data["decode"], name=name, x_name="batch_sizes",
                                          y_name="context_tokens", source=source,
                                          field="decode"),
            transfers=_transfers(data["transfers"], source),
        )


def _object(data: dict, key: str, source: str) -> dict:
    value = data[key]
    if not isinstance(value, dict):
        raise ProfileError("must be an object", file=source, field=key)
    return value


def _number(data: dict, key: str, source: str, *, integer: bool = False,
            minimum: float = 0.0, prefix: str = "") -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not float(value).is_integer()):
        kind = "an integer" if integer else "a number"
        raise ProfileError(f"must be {kind}, got {value!r}", file=source, field=prefix + key)
    if not math.isfinite(value) or value < minimum:
        raise ProfileError(f"must be finite and >= {minimum:g}, got {value!r}", file=source,
                           field=prefix + key)
    return float(value)


def _model(data: object, name: str, source: str) -> ModelSpec:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="model")
    try:
        return ModelSpec(**{k: v for k, v in data.items() if k != "kv_bytes_per_token"})
    except TypeError as exc:
        raise ProfileError(f"not a model architecture: {exc}", file=source,
                           field="model") from exc


def _batched(data: object, source: str) -> SeparableBatchModel:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="batched_prefill")
    if data.get("model") != "separable":
        raise ProfileError(f"unknown model {data.get('model')!r}; known: 'separable'",
                           file=source, field="batched_prefill.model")
    if data.get("padding", "none") not in ("none", "left"):
        raise ProfileError(f"unknown padding {data.get('padding')!r}; known: 'none', 'left'",
                           file=source, field="batched_prefill.padding")
    p = "batched_prefill."
    return SeparableBatchModel(
        per_iteration_s=_number(data, "per_iteration_s", source, prefix=p),
        per_token_s=_number(data, "per_token_s", source, prefix=p),
        per_pair_s=_number(data, "per_pair_s", source, prefix=p),
        fit=data.get("fit", {}) if isinstance(data.get("fit", {}), dict) else {},
        padding=data.get("padding", "none"),
    )


def _transfers(data: object, source: str) -> Transfers:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="transfers")
    p = "transfers."
    bandwidths = {k: _number(data, k, source, prefix=p) for k in (
        "host_to_device_bytes_per_s", "device_to_host_bytes_per_s")}
    for key, value in bandwidths.items():
        if value <= 0:
            raise ProfileError("bandwidth must be > 0", file=source, field=p + key)
    return Transfers(
        host_to_device_bytes_per_s=bandwidths["host_to_device_bytes_per_s"],
        host_to_device_latency_s=_number(data, "host_to_device_latency_s", source, prefix=p),
        device_to_host_bytes_per_s=bandwidths["device_to_host_bytes_per_s"],
        device_to_host_latency_s=_number(data, "device_to_host_latency_s", source, prefix=p),
    )


# --------------------------------------------------------------------------- shipped files
def _data_folder():
    return resources.files("ragsim.profiles") / "data"


def shipped_profile_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in _data_folder().iterdir()
                  if p.name.endswith(".json"))


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (``a10g-mistral-7b``) or a JSON file by path."""
    path = Path(name_or_path)
    if path.exists():
        text, source = path.read_text(), str(path)
    elif name_or_path in shipped_profile_names():
        text = (_data_folder() / f"{name_or_path}.json").read_text()
        source = name_or_path
    else:
        raise ProfileError(
            f"no such file, and not a shipped profile; shipped: {shipped_profile_names()}",
            file=name_or_path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"not valid JSON: {exc}", file=source) from exc
    return Profile.from_dict(data, source=source)


def fit_separable(cached: Sequence[Sequence[float]], new: Sequence[Sequence[float]],
                  seconds: Sequence[float], padding: str = "none") -> SeparableBatchModel:
    """Least-squares fit (non-negative) of the separable batch model to measured iterations.

    Each iteration i prefilled requests with ``cached[i][r]`` and ``new[i][r]`` tokens and took
    ``seconds[i]``. Rows are weighted by 1/seconds so the fit minimises relative error; errors
    are reported as median and max over the iterations.
    """
    from scipy.optimize import nnls

    rows = [(1.0, *batch_features(a, b, padding)) for a, b in zip(cached, new, strict=True)]
    design = np.asarray(rows)
    target = np.asarray(seconds, dtype=np.float64)
    weights = 1.0 / np.maximum(target, 1e-12)
    coef, _ = nnls(design * weights[:, None], target * weights)
    predicted = design @ coef
    rel = np.abs(predicted - target) / np.maximum(target, 1e-12)
    return SeparableBatchModel(
        per_iteration_s=float(coef[0]), per_token_s=float(coef[1]), per_pair_s=float(coef[2]),
        fit={"points": len(target), "median_rel_error": float(np.median(rel)),
             "max_rel_error": float(np.max(rel))},
        padding=padding,
    )
