"""Datasheet numbers of the GPUs ragsim ships derived profiles for, each with its source.

Peak tensor throughput is dense (no 2:4 sparsity) FP16/BF16 with FP32 accumulate; bandwidths
are bytes per second in one direction. Where sources disagree the choice and the reason are
written next to the number.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    name: str
    device: str
    peak_flops: float
    memory_bytes: float
    memory_bytes_per_s: float
    host_link: str
    host_link_bytes_per_s: float  # theoretical, one direction
    host_copy_bytes_per_s: float  # measured pinned copies, one direction
    interconnect_bytes_per_s: float | None  # NVLink, one direction; None: PCIe only
    sources: dict[str, str] = field(default_factory=dict)


_PCIE4 = 31.5e9  # 16 GT/s x 16 lanes x 128/130 / 8, per direction
_PCIE5 = 63.0e9  # 32 GT/s x 16 lanes x 128/130 / 8
_PCIE4_SRC = ("PCIe 4.0 x16: 16 GT/s x 16 lanes x 128b/130b = 31.5 GB/s per direction "
              "(NVIDIA's '64 GB/s' counts both)")
_PCIE5_SRC = "PCIe 5.0 x16: 32 GT/s x 16 x 128b/130b = 63 GB/s per direction"
_GEN4_COPY = ("nvbandwidth host_to_device_memcpy on A10 (25.2 GB/s, github.com/drkennetz/"
              "cuda_examples PR 1) and A100-SXM4 (25.1 GB/s, github.com/NVIDIA/nvbandwidth "
              "issue 42); Azure ND A100 v4 health checks require >= 24 GB/s both ways")
_GEN5_COPY = ("Azure ND H100 v5 / ND H200 v5 health checks require >= 52 / 48 GB/s host<->"
              "device (github.com/Azure/azurehpc-health-checks conf files)")

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a10g", "NVIDIA A10G 24GB", 125e12, 24e9, 600e9, "PCIe 4.0 x16", _PCIE4, 25e9, None, {
        "peak_flops": "NVIDIA A10 datasheet: 125 TFLOPS dense FP16 tensor. Sources disagree "
        "for the A10G (some list ~70); only 125 is consistent with RAGCache's measurement that "
        "a ~4,000-token prefill of a 7B model takes about one second on A10G, given the dense "
        "efficiency measured on A100/H100 (see profiles)",
        "memory": "AWS g5 documentation: 24 GiB per A10G; 600 GB/s GDDR6 (Baseten, 'NVIDIA "
        "A10 vs A10G for ML model inference')",
        "host_link": _PCIE4_SRC + "; assumed from the A10 (PCIe 4.0 x16)",
        "host_copy": _GEN4_COPY + "; no A10G-specific measurement found, the A10 is the proxy",
    }),
    GPU("l4", "NVIDIA L4 24GB", 121e12, 24e9, 300e9, "PCIe 4.0 x16", _PCIE4, 25e9, None, {
        "peak_flops": "NVIDIA L4 datasheet: 242 TFLOPS FP16 tensor with sparsity, 121 dense",
        "memory": "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s",
        "host_link": _PCIE4_SRC,
        "host_copy": _GEN4_COPY,
    }),
    GPU("a100", "NVIDIA A100-SXM4-80GB", 312e12, 80e9, 2039e9, "PCIe 4.0 x16", _PCIE4, 25e9,
        300e9, {
            "peak_flops": "NVIDIA A100 datasheet: 312 TFLOPS FP16/BF16 tensor dense",
            "memory": "NVIDIA A100 datasheet: 80 GB HBM2e, 2,039 GB/s (SXM)",
            "host_link": _PCIE4_SRC,
            "host_copy": _GEN4_COPY,
            "interconnect": "NVIDIA A100 datasheet: NVLink 600 GB/s (300 GB/s per direction)",
        }),
    GPU("h100", "NVIDIA H100-SXM5-80GB", 989e12, 80e9, 3350e9, "PCIe 5.0 x16", _PCIE5, 50e9,
        450e9, {
            "peak_flops": "NVIDIA H100 datasheet: 1,979 TFLOPS BF16/FP16 tensor with sparsity, "
            "989 dense",
            "memory": "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s",
            "host_link": _PCIE5_SRC,
            "host_copy": _GEN5_COPY,
            "interconnect": "NVIDIA H100 datasheet: NVLink 900 GB/s (450 per direction)",
        }),
    GPU("h200", "NVIDIA H200-SXM-141GB", 989e12, 141e9, 4800e9, "PCIe 5.0 x16", _PCIE5, 50e9,
        450e9, {
            "peak_flops": "same GH100 compute as H100: 989 TFLOPS dense (NVIDIA lists 1,979 "
            "with sparsity)",
            "memory": "NVIDIA H200 page and its MLPerf v4.1 system file: 141 GB HBM3e, 4.8 TB/s",
            "host_link": _PCIE5_SRC,
            "host_copy": _GEN5_COPY,
            "interconnect": "NVIDIA MLPerf v4.1 H200 system file: NVLink 900 GB/s",
        }),
    GPU("h800", "NVIDIA H800-SXM5-80GB", 989e12, 80e9, 3350e9, "PCIe 5.0 x16", _PCIE5, 50e9,
        200e9, {
            "peak_flops": "same silicon and tensor rates as H100: 989 TFLOPS dense",
            "memory": "80 GB HBM3 at 3.35 TB/s as H100 SXM5 (some sources list 2.04 TB/s, which "
            "matches the H800 PCIe card; not confirmed from an NVIDIA datasheet)",
            "host_link": _PCIE5_SRC,
            "host_copy": _GEN5_COPY,
            "interconnect": "NVLink 400 GB/s (200 per direction), 8 links instead of H100's "
            "18 (DeepSeek-V3 hardware paper, arXiv 2505.09343); DeepEP reports ~160 GB/s "
            "achieved",
        }),
)}
