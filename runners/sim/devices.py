"""Public figures of the simulated NPUs, and the memory-fit rule every search can use.

Only spec-sheet numbers live here (each with its source); the behaviour the estimator must
not see (efficiencies, kernels, compiler quirks, host effects) lives in the other modules
of ``runners.sim``. A "device" is what one unit of tensor parallelism occupies: a NeuronCore
on AWS Neuron (NxD Inference's ``tp_degree`` counts cores), a chip on Cloud TPU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from lens.errors import UserError
from lens.types import ModelShape

GIB = 1024**3
GB = 1e9

#: bytes per element of each accepted dtype
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8": 1, "int8": 1}


@dataclass(frozen=True)
class DeviceSpec:
    """One tensor-parallel device of a simulated accelerator family (public figures only)."""

    hardware: str
    device: str
    instance: str
    devices_per_host: int
    devices_per_chip: int
    memory_bytes: float
    peak_tflops: float  # dense BF16, per device
    peak_tflops_8bit: float  # FP8/INT8 where published, else the BF16 figure
    bandwidth_gbs: float  # HBM, GB/s (1e9 bytes) per device
    link_gbs: float  # collective bandwidth per device and direction, GB/s
    source: str

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


# Neuron: figures per chip from the aws-neuron-sdk architecture docs (inferentia2,
# inf2-arch, neuron-core-v2, trainium, trainium2), split evenly over the chip's cores.
# TPU: per chip from the Cloud TPU v5e / v5p / v6e docs. Interconnects are quoted per
# chip (Neuron) or bidirectional (TPU ICI); a ring all-reduce uses one direction.
DEVICES: dict[str, DeviceSpec] = {
    # Inferentia2: 190 TFLOPS BF16, 32 GiB HBM, 820 GiB/s, NeuronLink-v2 192 GiB/s per
    # chip, 2 NeuronCore-v2 per chip; inf2.48xlarge has 12 chips = 24 cores.
    "inf2": DeviceSpec(
        "inf2", "NeuronCore-v2", "inf2.48xlarge", 24, 2,
        memory_bytes=16 * GIB, peak_tflops=95.0, peak_tflops_8bit=95.0,
        bandwidth_gbs=410 * GIB / GB, link_gbs=96 * GIB / GB,
        source="aws-neuron-sdk: inferentia2, inf2-arch, neuron-core-v2",
    ),
    # Trainium1: same core and HBM as Inferentia2, NeuronLink 384 GiB/s per chip;
    # trn1.32xlarge has 16 chips = 32 cores.
    "trn1": DeviceSpec(
        "trn1", "NeuronCore-v2", "trn1.32xlarge", 32, 2,
        memory_bytes=16 * GIB, peak_tflops=95.0, peak_tflops_8bit=95.0,
        bandwidth_gbs=410 * GIB / GB, link_gbs=192 * GIB / GB,
        source="aws-neuron-sdk: trainium, neuron-core-v2",
    ),
    # Trainium2: 667 TFLOPS BF16 (1299 FP8), 96 GiB, 2.9 TB/s, NeuronLink-v3 1.28 TB/s per
    # chip, 8 NeuronCore-v3. Simulated with the default logical core of two physical
    # cores (LNC=2): 4 logical cores per chip; trn2.48xlarge has 16 chips = 64 of them.
    "trn2": DeviceSpec(
        "trn2", "NeuronCore-v3 (LNC=2)", "trn2.48xlarge", 64, 4,
        memory_bytes=24 * GIB, peak_tflops=667.0 / 4, peak_tflops_8bit=1299.0 / 4,
        bandwidth_gbs=2900.0 / 4, link_gbs=1280.0 / 4,
        source="aws-neuron-sdk: trainium2",
    ),
    # TPU v5e: 197 TFLOPS BF16, 16 GB HBM, 819 GB/s, ICI 400 GB/s bidirectional, 8 chips per host.
    "tpu-v5e": DeviceSpec(
        "tpu-v5e", "TPU v5e chip", "v5litepod-8", 8, 1,
        memory_bytes=16 * GB, peak_tflops=197.0, peak_tflops_8bit=197.0,
        bandwidth_gbs=819.0, link_gbs=400.0 / 2,
        source="Cloud TPU v5e docs",
    ),
    # TPU v6e (Trillium): 918 TFLOPS BF16, 32 GB HBM, 1638 GB/s, ICI 800 GB/s bidirectional, 8 chips per host.
    "tpu-v6e": DeviceSpec(
        "tpu-v6e", "TPU v6e chip", "v6e-8", 8, 1,
        memory_bytes=32 * GB, peak_tflops=918.0, peak_tflops_8bit=918.0,
        bandwidth_gbs=1638.0, link_gbs=800.0 / 2,
        source="Cloud TPU v6e docs",
    ),
    # TPU v5p: 459 TFLOPS BF16, 95 GB HBM, 2765 GB/s, ICI 1200 GB/s bidirectional; a v5p
    # host (VM) has 4 chips.
    "tpu-v5p": DeviceSpec(
        "tpu-v5p", "TPU v5p chip", "v5p-8", 4, 1,
        memory_bytes=95 * GB, peak_tflops=459.0, peak_tflops_8bit=459.0,
        bandwidth_gbs=2765.0, link_gbs=1200.0 / 2,
        source="Cloud TPU v5p docs",
    ),
}

#: share of device memory a model may use; the runtime, compiled graphs and activation
#: scratch take the rest (Neuron runtime and XLA both reserve some HBM)
USABLE_MEMORY = 0.90


def hardware_names() -> list[str]:
    return sorted(DEVICES)


def device_spec(hardware: str) -> DeviceSpec:
    """The spec of ``hardware``; ``UserError`` listing the known ones when unknown."""
    try:
        return DEVICES[hardware]
    except KeyError:
        raise UserError(
            f"sim runner: unknown hardware {hardware!r}; choose one of {', '.join(hardware_names())}"
        ) from None


def device_info(hardware: str) -> dict:
    """Public figures of one simulated device: memory (GiB), devices per host, TFLOPS, GB/s."""
    s = device_spec(hardware)
    d = asdict(s)
    d.pop("memory_bytes")
    d["memory_gib"] = s.memory_gib
    d["usable_memory_gib"] = s.memory_gib * USABLE_MEMORY
    return d


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise UserError(f"sim runner: dtype {dtype!r} is not simulated; use one of {', '.join(DTYPE_BYTES)}") from None


def kv_bytes_per_token(model: ModelShape, dtype: str) -> float:
    """KV-cache bytes of one token over all layers (keys and values), whole model."""
    return 2.0 * model.layers * model.kv_heads * model.head_dim * dtype_bytes(dtype)


def memory_need_bytes(model: ModelShape, dtype: str, tp: int, batch: int, max_len: int) -> float:
    """Bytes per device: sharded weights plus a KV cache of ``batch`` rows x ``max_len`` tokens."""
    weights = model.param_count() * dtype_bytes(dtype) / tp
    kv = batch * max_len * kv_bytes_per_token(model, dtype) / tp
    return weights + kv


def memory_need_gib(model: ModelShape, dtype: str, tp: int, batch: int, max_len: int) -> float:
    return memory_need_bytes(model, dtype, tp, batch, max_len) / GIB


def fits_memory(hardware: str, model: ModelShape, dtype: str, tp: int, batch: int, max_len: int) -> bool:
    """Whether weights/tp plus the KV cache of batch x max_len fit one device's usable memory."""
    s = device_spec(hardware)
    return memory_need_bytes(model, dtype, tp, batch, max_len) <= s.memory_bytes * USABLE_MEMORY
