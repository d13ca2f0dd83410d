"""GPU specifications for the AMALI model, as data, each number with its source.

Sources named in ``GpuSpec.sources`` (field -> where the number comes from):

- ``spec sheet``: the vendor's public data sheet of the GPU: SM counts, dense BF16
  TFLOPS, memory bandwidth, L2 size, NVLink bandwidth per direction.
- ``AMALI paper``: Cao et al., "AMALI: An Analytical Model for Accurately Modeling LLM
  Inference on Modern GPUs", ISCA 2025 (doi 10.1145/3695053.3731064):
  the A100 latencies the paper used (L1 37, shared 23/19, L2 224, DRAM 290 cycles,
  80 L2 channels), tensor-core FMA per clock (A100 256, H100/H200 512), 4 sub-cores.
- ``cuda-guide``: the CUDA C++ Programming Guide's table of per-compute-capability
  limits (cc 8.0 A100, 9.0 H100/H200, 8.9 L4): warps, CTAs, registers and shared
  memory per SM, FP32 lanes and special-function (MUFU) results per clock per SM.
- ``derived``: computed from the numbers above (the formula is in the source text).
- ``assumption``: no public figure was found in the project's references; the value
  and its reasoning are stated, so it can be replaced by a measurement.

Latencies are in SM clock cycles; bandwidths per clock use the clock below.
The clock of each GPU is derived from its dense BF16 peak, so that
``2 * SMs * tensor cores per SM * FMA per clock * clock`` reproduces the spec-sheet TFLOPS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from ..errors import UserError

#: canonical dtype -> bytes per element; aliases map onto these. fp32 GEMMs are modelled on
#: the TF32 tensor-core path (what frameworks run when TF32 math is allowed); strict FP32
#: matrix products on CUDA cores are not modelled and run several times slower.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8", "float8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
}


def canonical_dtype(dtype: str) -> str:
    """``bf16``/``fp16``/``fp8`` for any accepted spelling; ``UserError`` otherwise."""
    key = str(dtype).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise UserError(
            f"dtype {dtype!r} is not modelled by AMALI: use one of {', '.join(sorted(DTYPE_BYTES))} "
            f"(aliases: {', '.join(sorted(k for k in _DTYPE_ALIASES if k not in DTYPE_BYTES))})"
        )
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU, as the AMALI model sees it (per-SM resources, latencies, bandwidths)."""

    name: str
    arch: str
    sms: int
    subcores_per_sm: int
    tensor_cores_per_sm: int
    #: dense tensor-core FMA per clock per tensor core, per dtype (absent: unsupported)
    tc_fma_per_clk: tuple[tuple[str, int], ...]
    dense_bf16_tflops: float
    fp32_lanes_per_sm: int
    sfu_per_sm_per_clk: int
    max_warps_per_sm: int
    max_ctas_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    smem_per_sm_kib: int
    smem_per_cta_kib: int
    l1_latency: int
    smem_latency: int
    l2_latency: int
    #: extra cycles of a DRAM access beyond the L2 lookup
    dram_latency: int
    l2_mb: float
    l2_bytes_per_clk: int
    #: bytes per clock one SM can receive from L2 (caps the share of a lightly loaded GPU)
    sm_l2_bytes_per_clk: int
    dram_gbps: float
    memory_gb: float
    link: str
    link_gbps_per_dir: float
    #: latency of one step of a ring collective over the link, microseconds
    link_hop_us: float
    #: the constant k of the launch term KLL = s * GridSize + k, microseconds
    kll_k_us: float
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    # -- derived ----------------------------------------------------------------------------
    @property
    def clock_mhz(self) -> float:
        """SM clock that reproduces the dense BF16 peak: TFLOPS / (2 * SMs * TCs * FMA/clk)."""
        fma = self.tc_fma("bf16")
        return self.dense_bf16_tflops * 1e6 / (2.0 * self.sms * self.tensor_cores_per_sm * fma)

    @property
    def clock_hz(self) -> float:
        return self.clock_mhz * 1e6

    @property
    def mem_latency(self) -> int:
        """Cycles of a load that misses L2 (L2 lookup plus DRAM)."""
        return self.l2_latency + self.dram_latency

    @property
    def dram_bytes_per_clk(self) -> float:
        return self.dram_gbps * 1e9 / self.clock_hz

    @property
    def kll_k_cycles(self) -> float:
        return self.kll_k_us * 1e-6 * self.clock_hz

    def supports(self, dtype: str) -> bool:
        """Whether ``dtype`` is modelled and has a dense tensor-core path here (never raises)."""
        key = str(dtype).strip().lower()
        return key in _DTYPE_ALIASES and _DTYPE_ALIASES[key] in dict(self.tc_fma_per_clk)

    def tc_fma(self, dtype: str) -> int:
        """Dense FMA per clock of ONE tensor core for ``dtype``; ``UserError`` if unsupported."""
        d = canonical_dtype(dtype)
        table = dict(self.tc_fma_per_clk)
        if d not in table:
            raise UserError(
                f"{self.name} has no dense {d} tensor-core path; use one of {', '.join(sorted(table))}"
            )
        return table[d]

    def tc_fma_per_sm(self, dtype: str) -> int:
        return self.tc_fma(dtype) * self.tensor_cores_per_sm

    def peak_tflops(self, dtype: str) -> float:
        return 2.0 * self.sms * self.tc_fma_per_sm(dtype) * self.clock_hz / 1e12

    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")


# The AMALI paper's A100 figures, reused where a GPU has no published value.
_PAPER_LAT = "AMALI paper: the paper's A100 figure"
_PAPER_LAT_REUSED = (
    "assumption: the paper's A100 figure (AMALI paper) reused; the project's references give "
    "no cycle latencies for this GPU"
)
_KLL_K = (
    "assumption: the fitted intercept k is not in the project's reading of the paper; "
    "1 us stands for a kernel's fixed start and drain cost on recent NVIDIA GPUs"
)
_HOP = (
    "assumption: about 1 us per step of a ring all-reduce for small messages; "
    "replace with a measured NCCL/custom all-reduce latency"
)

_A100 = GpuSpec(
    name="A100-SXM",
    arch="ampere",
    sms=108,
    subcores_per_sm=4,
    tensor_cores_per_sm=4,
    tc_fma_per_clk=(("bf16", 256), ("fp16", 256), ("fp32", 128)),
    dense_bf16_tflops=312.0,
    fp32_lanes_per_sm=64,
    sfu_per_sm_per_clk=16,
    max_warps_per_sm=64,
    max_ctas_per_sm=32,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    smem_per_sm_kib=164,
    smem_per_cta_kib=163,
    l1_latency=37,
    smem_latency=23,
    l2_latency=224,
    dram_latency=290,
    l2_mb=40.0,
    l2_bytes_per_clk=5120,
    sm_l2_bytes_per_clk=64,
    dram_gbps=2039.0,
    memory_gb=80.0,
    link="NVLink",
    link_gbps_per_dir=300.0,
    link_hop_us=1.0,
    kll_k_us=1.0,
    sources=(
        ("sms", "spec sheet; AMALI paper (108 SMs x 4 sub-cores)"),
        ("subcores_per_sm", "AMALI paper"),
        ("tensor_cores_per_sm", "cuda-guide / A100 whitepaper (4 third-generation tensor cores per SM)"),
        ("tc_fma_per_clk", "AMALI paper: 256 FP16/BF16 FMA per clock per tensor core (HMMA.16816 = 8 cycles); A100 has no FP8; TF32 at half rate (A100 datasheet: 156 dense TF32 TFLOPS)"),
        ("dense_bf16_tflops", "spec sheet: 312 dense BF16 TFLOPS"),
        ("clock_mhz", "derived: 312e12 / (2*108*4*256) = 1410 MHz, the paper's clock (AMALI paper)"),
        ("fp32_lanes_per_sm", "cuda-guide cc 8.0: 64 FP32 results per clock per SM"),
        ("sfu_per_sm_per_clk", "cuda-guide cc 8.0: 16 special-function results per clock per SM"),
        ("max_warps_per_sm", "cuda-guide cc 8.0"),
        ("max_ctas_per_sm", "cuda-guide cc 8.0"),
        ("regs_per_sm", "cuda-guide cc 8.0"),
        ("max_regs_per_thread", "cuda-guide cc 8.0"),
        ("smem_per_sm_kib", "cuda-guide cc 8.0: 164 KB shared memory per SM"),
        ("smem_per_cta_kib", "cuda-guide cc 8.0: 163 KB per block (opt-in)"),
        ("l1_latency", _PAPER_LAT + " (37 cycles)"),
        ("smem_latency", _PAPER_LAT + " (23/19 cycles; the larger is used)"),
        ("l2_latency", _PAPER_LAT + " (224 cycles)"),
        ("dram_latency", _PAPER_LAT + " (290 cycles, read as beyond the L2 lookup)"),
        ("l2_mb", "spec sheet / AMALI paper: 40 MB"),
        ("l2_bytes_per_clk", "NVIDIA A100 architecture whitepaper: 5120 bytes/clk L2 read bandwidth (80 channels in the AMALI paper)"),
        ("sm_l2_bytes_per_clk", "assumption: 64 bytes per clock into one SM (two 32-byte sectors)"),
        ("dram_gbps", "spec sheet: 2039 GB/s (A100 SXM 80GB; the paper's board had 1940 GB/s)"),
        ("memory_gb", "spec sheet: 80 GiB"),
        ("link_gbps_per_dir", "spec sheet: NVLink 300 GB/s per direction"),
        ("link_hop_us", _HOP),
        ("kll_k_us", _KLL_K),
    ),
)

_H100 = GpuSpec(
    name="H100-SXM",
    arch="hopper",
    sms=132,
    subcores_per_sm=4,
    tensor_cores_per_sm=4,
    tc_fma_per_clk=(("bf16", 512), ("fp16", 512), ("fp8", 1024), ("fp32", 256)),
    dense_bf16_tflops=989.0,
    fp32_lanes_per_sm=128,
    sfu_per_sm_per_clk=16,
    max_warps_per_sm=64,
    max_ctas_per_sm=32,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    smem_per_sm_kib=228,
    smem_per_cta_kib=227,
    l1_latency=37,
    smem_latency=23,
    l2_latency=224,
    dram_latency=290,
    l2_mb=50.0,
    l2_bytes_per_clk=5120,
    sm_l2_bytes_per_clk=64,
    dram_gbps=3350.0,
    memory_gb=80.0,
    link="NVLink",
    link_gbps_per_dir=450.0,
    link_hop_us=1.0,
    kll_k_us=1.0,
    sources=(
        ("sms", "spec sheet: 132 SMs"),
        ("subcores_per_sm", "AMALI paper (same SM partitioning as A100)"),
        ("tensor_cores_per_sm", "cuda-guide / H100 whitepaper (4 fourth-generation tensor cores per SM)"),
        ("tc_fma_per_clk", "AMALI paper: 512 BF16 FMA per clock per tensor core; FP8 doubles it (spec sheet: FP8 1978 TFLOPS); TF32 at half rate (H100 SXM datasheet: 989 TF32 TFLOPS with sparsity, 495 dense)"),
        ("dense_bf16_tflops", "spec sheet: 989 dense BF16 TFLOPS"),
        ("clock_mhz", "derived: 989e12 / (2*132*4*512) = 1830 MHz (the board's maximum boost is higher; tensor work runs near this)"),
        ("fp32_lanes_per_sm", "cuda-guide cc 9.0: 128 FP32 results per clock per SM"),
        ("sfu_per_sm_per_clk", "cuda-guide cc 9.0: 16 special-function results per clock per SM"),
        ("max_warps_per_sm", "cuda-guide cc 9.0"),
        ("max_ctas_per_sm", "cuda-guide cc 9.0"),
        ("regs_per_sm", "cuda-guide cc 9.0"),
        ("max_regs_per_thread", "cuda-guide cc 9.0"),
        ("smem_per_sm_kib", "cuda-guide cc 9.0: 228 KB shared memory per SM"),
        ("smem_per_cta_kib", "cuda-guide cc 9.0: 227 KB per block (opt-in)"),
        ("l1_latency", _PAPER_LAT_REUSED),
        ("smem_latency", _PAPER_LAT_REUSED),
        ("l2_latency", _PAPER_LAT_REUSED),
        ("dram_latency", _PAPER_LAT_REUSED),
        ("l2_mb", "spec sheet: 50 MB"),
        ("l2_bytes_per_clk", "assumption: A100's 5120 bytes/clk (no per-clock figure published for H100)"),
        ("sm_l2_bytes_per_clk", "assumption: 64 bytes per clock into one SM"),
        ("dram_gbps", "spec sheet: 3350 GB/s"),
        ("memory_gb", "spec sheet: 80 GB"),
        ("link_gbps_per_dir", "spec sheet: NVLink 450 GB/s per direction"),
        ("link_hop_us", _HOP),
        ("kll_k_us", _KLL_K),
    ),
)

_H200 = replace(
    _H100,
    name="H200-SXM",
    dram_gbps=4800.0,
    memory_gb=141.0,
    sources=(
        *[(k, v) for k, v in _H100.sources if k not in ("dram_gbps", "memory_gb", "sms", "l2_mb")],
        ("sms", "spec sheet: H100 die (132 SMs)"),
        ("l2_mb", "spec sheet: H100 die (50 MB)"),
        ("dram_gbps", "spec sheet: 4800 GB/s"),
        ("memory_gb", "spec sheet: 141 GB"),
    ),
)

_L4 = GpuSpec(
    name="L4",
    arch="ada",
    sms=58,
    subcores_per_sm=4,
    tensor_cores_per_sm=4,
    tc_fma_per_clk=(("bf16", 128), ("fp16", 128), ("fp8", 256), ("fp32", 64)),
    dense_bf16_tflops=121.0,
    fp32_lanes_per_sm=128,
    sfu_per_sm_per_clk=16,
    max_warps_per_sm=48,
    max_ctas_per_sm=24,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    smem_per_sm_kib=100,
    smem_per_cta_kib=99,
    l1_latency=37,
    smem_latency=23,
    l2_latency=224,
    dram_latency=290,
    l2_mb=48.0,
    l2_bytes_per_clk=58 * 64,
    sm_l2_bytes_per_clk=64,
    dram_gbps=300.0,
    memory_gb=24.0,
    link="PCIe Gen4 x16",
    link_gbps_per_dir=31.5,
    link_hop_us=1.0,
    kll_k_us=1.0,
    sources=(
        ("sms", "NVIDIA L4 datasheet: 7424 CUDA cores = 58 SMs x 128"),
        ("subcores_per_sm", "cuda-guide cc 8.9 (4 SM sub-partitions)"),
        ("tensor_cores_per_sm", "NVIDIA L4 datasheet: 232 tensor cores = 58 SMs x 4"),
        ("tc_fma_per_clk", "derived: 121 TFLOPS (spec sheet) at the 2040 MHz boost = 128 BF16 FMA per clock per tensor core; FP8 doubles it (datasheet: 485 TFLOPS FP8 with sparsity); TF32 at half rate (datasheet: 120 TF32 TFLOPS with sparsity, 60 dense)"),
        ("dense_bf16_tflops", "spec sheet: 121 dense BF16 TFLOPS"),
        ("clock_mhz", "derived: 121e12 / (2*58*4*128) = 2037 MHz (datasheet boost 2040 MHz)"),
        ("fp32_lanes_per_sm", "cuda-guide cc 8.9: 128 FP32 results per clock per SM"),
        ("sfu_per_sm_per_clk", "cuda-guide cc 8.9: 16 special-function results per clock per SM"),
        ("max_warps_per_sm", "cuda-guide cc 8.9: 48 warps per SM"),
        ("max_ctas_per_sm", "cuda-guide cc 8.9: 24 blocks per SM"),
        ("regs_per_sm", "cuda-guide cc 8.9"),
        ("max_regs_per_thread", "cuda-guide cc 8.9"),
        ("smem_per_sm_kib", "cuda-guide cc 8.9: 100 KB shared memory per SM"),
        ("smem_per_cta_kib", "cuda-guide cc 8.9: 99 KB per block (opt-in)"),
        ("l1_latency", _PAPER_LAT_REUSED),
        ("smem_latency", _PAPER_LAT_REUSED),
        ("l2_latency", _PAPER_LAT_REUSED),
        ("dram_latency", _PAPER_LAT_REUSED),
        ("l2_mb", "spec sheet: 48 MB"),
        ("l2_bytes_per_clk", "assumption: 64 bytes per clock per SM x 58 SMs (no published L2 bandwidth)"),
        ("sm_l2_bytes_per_clk", "assumption: 64 bytes per clock into one SM"),
        ("dram_gbps", "spec sheet: 300 GB/s"),
        ("memory_gb", "spec sheet: 24 GiB"),
        ("link_gbps_per_dir", "spec sheet: PCIe Gen4; 16 GT/s x 16 lanes (128b/130b) = 31.5 GB/s per direction (PCIe 4.0 spec)"),
        ("link_hop_us", _HOP),
        ("kll_k_us", _KLL_K),
    ),
)

#: known GPUs by canonical name
GPUS: Mapping[str, GpuSpec] = {g.name: g for g in (_A100, _H100, _H200, _L4)}


def _norm(name: str) -> str:
    s = re.sub(r"[^a-z0-9]", "", str(name).lower())
    s = s.removeprefix("nvidia")
    for suffix in ("sxm5", "sxm4", "sxm", "80gb", "141gb", "40gb", "24gb"):
        s = s.replace(suffix, "")
    return s


_INDEX = {_norm(k): k for k in GPUS}


def known_gpus() -> list[str]:
    """Canonical names of the GPUs the model has specs for."""
    return sorted(GPUS)


def is_known_gpu(name: str) -> bool:
    return _norm(name) in _INDEX


def gpu_spec(name: str) -> GpuSpec:
    """The spec of ``name`` (case and punctuation ignored: "h200", "NVIDIA-H200", "H200 SXM").

    Raises ``UserError`` listing the known GPUs for an unknown name.
    """
    key = _norm(name)
    if key not in _INDEX:
        raise UserError(
            f"unknown GPU {name!r} for the AMALI model: known GPUs are {', '.join(known_gpus())} "
            f"(pass one with --gpu, or add its spec to lens/amali/specs.py)"
        )
    return GPUS[_INDEX[key]]
