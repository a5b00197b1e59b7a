"""Device presets: edge devices modelled from their published specifications.

A preset turns a layer's cost (FLOPs, bytes; `hppctl.models.profile.LayerCost`) into forward
and backward seconds at any batch size. Pure Python (no torch): `hppctl profile` with only
preset devices, the planner's tests and the benchmarks all use it without a device.

The model, per layer and batch size β (docs/presets.md derives every number):

    n_ops    kernels the layer launches (1 for a leaf module, more for a block)
    elems    output elements per kernel per sample (activation bytes / dtype bytes / n_ops)
    occ(β)   = n / sqrt(n² + n_sat²),  n = β·elems      # small batches under-use the device
    t_comp   = β·flops / (peak · eff[class] · occ(β))
    t_mem    = (β·(input + activation bytes) + param bytes) / (bandwidth · mem_eff)
    t_fwd(β) = n_ops · op_overhead + max(t_comp, t_mem)   # roofline plus a fixed launch cost
    t_bwd(β) = backward_ratio[class] · t_fwd(β)
    t_wgt(β) = weight_grad_share(layer) · t_bwd(β)      # the weight-gradient part of the backward

so per-sample time falls with β (fixed overhead, occupancy, weights read once per call) and
then levels off: time is affine-to-linear in β, not proportional, as Fig. 6 of the Asteroid
paper shows for TX2 and NX. The class of a layer (conv, depthwise, matmul, memory-bound,
block) comes from its module type and its arithmetic intensity; see `classify`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hppctl.errors import UnknownPreset, shorten
from hppctl.models.profile import LayerCost

GiB = 2**30

# ---------------------------------------------------------------------------------------------
# Layer classes
# ---------------------------------------------------------------------------------------------

CONV, DEPTHWISE, MATMUL, MEMORY, BLOCK_CNN, BLOCK_TRANSFORMER = (
    "conv", "depthwise", "matmul", "memory", "block-cnn", "block-transformer")
CLASSES = (CONV, DEPTHWISE, MATMUL, MEMORY, BLOCK_CNN, BLOCK_TRANSFORMER)

# Leaf module types (torch.nn and Hugging Face class names, lower-cased, alphanumerics only).
LEAF_CLASSES: dict[str, str] = {
    **{k: CONV for k in ("conv2d", "conv3d", "convtranspose1d", "convtranspose2d", "convtranspose3d")},
    **{k: DEPTHWISE for k in ("efficientnetdepthwiseconv2d", "depthwiseconv2d")},
    # torch's Conv1d and Hugging Face's GPT-2 `Conv1D` share a key; both are GEMMs over positions.
    **{k: MATMUL for k in ("linear", "conv1d", "bilinear", "nonlinearlinear")},
    **{k: MEMORY for k in (
        "batchnorm1d", "batchnorm2d", "batchnorm3d", "syncbatchnorm", "layernorm", "groupnorm", "instancenorm2d",
        "rmsnorm", "relu", "relu6", "leakyrelu", "silu", "gelu", "geluactivation", "newgeluactivation",
        "fastgeluactivation", "quickgeluactivation", "sigmoid", "tanh", "hardswish", "hardsigmoid", "elu", "mish",
        "dropout", "dropout2d", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "adaptivemaxpool2d", "zeropad2d",
        "constantpad2d", "flatten", "identity", "softmax", "embedding", "upsample", "pixelshuffle",
    )},
}
_CNN_BLOCK_WORDS = ("residual", "bottleneck", "basicblock", "mbconv", "squeezeexcit", "stem", "convnormactivation",
                    "convlayer", "convbnact")
_TRANSFORMER_WORDS = ("bert", "gpt", "opt", "transformer", "attention", "decoder", "encoder", "block", "layer",
                      "mlp", "ffn", "feedforward", "intermediate", "selfoutput")
_MEMORY_WORDS = ("norm", "relu", "gelu", "silu", "swish", "sigmoid", "tanh", "activation", "dropout", "pool", "pad",
                 "flatten", "identity", "softmax", "embedding", "add", "mul", "scale")

# Kernels one forward call of a composite module launches (the fixed overhead is paid per kernel),
# counted from the module's forward(): e.g. MobileNetV2's inverted residual is
# conv-bn-relu6, dw conv-bn-relu6, conv-bn (+ add) = 9. Matched exactly, then as a substring;
# other composites count DEFAULT_BLOCK_OPS.
BLOCK_OPS: dict[str, int] = {
    "mobilenetv2invertedresidual": 9, "invertedresidual": 9,
    # expand conv-bn-act, dw conv-bn-act, SE (pool conv act conv sigmoid mul), project conv-bn, add
    "efficientnetblock": 17, "mbconv": 17,
    "resnetbottlenecklayer": 11, "bottleneck": 11,   # 3x (conv bn relu) + add + relu (shortcut conv-bn aside)
    "resnetbasiclayer": 8, "basicblock": 8,
    "convnormactivation": 3, "convbnact": 3, "convlayer": 3, "stem": 3,
    "squeezeexcit": 6,
    "bertlayer": 20, "transformerblock": 20, "gpt2block": 22, "optdecoderlayer": 22, "decoderlayer": 22,
    "encoderlayer": 20, "attention": 10, "intermediate": 2, "selfoutput": 4, "mlp": 3,
}
DEFAULT_BLOCK_OPS = 10


def _kind_key(kind: str) -> str:
    return "".join(ch for ch in kind.lower() if ch.isalnum())


def classify(layer: LayerCost, dtype_bytes: int = 4) -> str:
    """The cost class of a layer, from its module type and arithmetic intensity.

    Depthwise convolutions carry torch's ordinary `Conv2d` type; they are told apart by their
    FLOPs per output element (2·k² ≤ 50 for k ≤ 5, against 2·C_in·k² for a dense conv).
    Unknown types are classified by words in their name, then by FLOPs per byte touched.
    """
    key = _kind_key(layer.kind)
    cls = LEAF_CLASSES.get(key)
    if cls is None:
        if "depthwise" in key or "dwconv" in key:
            cls = DEPTHWISE
        elif any(w in key for w in _CNN_BLOCK_WORDS):
            cls = BLOCK_CNN
        elif key.endswith("norm") or key.endswith("activation") or key.endswith("dropout"):
            cls = MEMORY
        elif any(w in key for w in _TRANSFORMER_WORDS):
            cls = BLOCK_TRANSFORMER
        elif "conv" in key:
            cls = CONV
        elif any(w in key for w in ("linear", "dense", "proj", "matmul", "gemm")):
            cls = MATMUL
        elif any(w in key for w in _MEMORY_WORDS):
            cls = MEMORY
        else:
            touched = layer.boundary_bytes_per_sample + layer.activation_bytes_per_sample
            cls = MATMUL if layer.forward_flops_per_sample > 8 * max(1, touched) else MEMORY
    if cls == CONV:
        elems = max(1, layer.activation_bytes_per_sample // dtype_bytes)
        if layer.forward_flops_per_sample <= 50 * elems:
            cls = DEPTHWISE
    return cls


def kernel_count(layer: LayerCost) -> int:
    """Kernels one forward of the layer launches: 1 for a leaf module, BLOCK_OPS for a block."""
    key = _kind_key(layer.kind)
    if key in LEAF_CLASSES:
        return 1
    if key in BLOCK_OPS:
        return BLOCK_OPS[key]
    if classify(layer) in (BLOCK_CNN, BLOCK_TRANSFORMER):
        for name, ops in BLOCK_OPS.items():
            if name in key:
                return ops
        return DEFAULT_BLOCK_OPS
    return 1


# ---------------------------------------------------------------------------------------------
# Weight-gradient shares
# ---------------------------------------------------------------------------------------------

NO_WEIGHTS, EMBEDDING = "no-weights", "embedding"
FIXED_WEIGHT_GRAD_SHARES = {NO_WEIGHTS: 0.0, EMBEDDING: 1.0}
"""Shares that follow from what the layer is: a layer without parameters has no weight gradient; an
embedding's input (token ids) carries no gradient, so its whole backward is its weight gradient."""

WEIGHT_GRAD_SHARE = {CONV: 0.40, DEPTHWISE: 0.55, MATMUL: 0.45, MEMORY: 0.05, BLOCK_CNN: 0.35,
                     BLOCK_TRANSFORMER: 0.50}
"""The part of a layer's backward that computes its weight gradients (what a split backward defers to
its `W`), per class of a layer with parameters: the mean over the zoo's models of the share measured
on the project's VM, one thread (`python -m hppctl.profiling.weight_shares`; every run in
docs/presets.md). A dense convolution or GEMM spends as many FLOPs on its weight gradient as on its
input gradient (0.45-0.49 measured where they dominate: resnet50, bert-small); a block less (its
norms and activations have next to none); a batch norm almost nothing (its scale and shift
gradients are sums its input gradient needs anyway). Depthwise convolutions vary most: 0.27-0.31 in
mobilenetv2 (3x3), 0.86 in efficientnet-b1 (torch's depthwise weight-gradient kernel)."""


def weight_grad_key(layer: LayerCost, dtype_bytes: int = 4) -> str:
    """Which weight-gradient share a layer takes: NO_WEIGHTS, EMBEDDING or its class (`classify`)."""
    if layer.param_bytes == 0:
        return NO_WEIGHTS
    if "embedding" in _kind_key(layer.kind):
        return EMBEDDING
    return classify(layer, dtype_bytes)


def weight_grad_share(layer: LayerCost, dtype_bytes: int = 4) -> float:
    """The weight-gradient part of the layer's backward, as a fraction of it (0..1)."""
    key = weight_grad_key(layer, dtype_bytes)
    return FIXED_WEIGHT_GRAD_SHARES.get(key, WEIGHT_GRAD_SHARE.get(key, 0.0))


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePreset:
    """One modelled device. Every number has a source or a derivation in docs/presets.md."""

    name: str
    description: str
    computes_on: str
    """What runs the layers: "GPU" or "CPU"."""
    product: str
    """The device as people name it, e.g. "Jetson Xavier NX"."""
    peak_flops: float
    """Peak FP32 FLOP/s of what computes (cores x 2 FLOPs per FMA x clock)."""
    memory_total_bytes: int
    memory_reserved_bytes: int
    """Held back for the OS, the CUDA context / framework and allocator slack."""
    memory_bandwidth_bytes_per_s: float
    """DRAM bandwidth from the datasheet (bus width x transfer rate)."""
    memory_efficiency: float
    """Fraction of the DRAM bandwidth streaming kernels achieve (STREAM-like)."""
    op_overhead_s: float
    """Fixed time per kernel in a forward pass (framework dispatch + launch); paid at any batch size."""
    saturation_elements: float
    """Output elements one kernel needs to reach 1/sqrt(2) of full efficiency (the device's parallel width)."""
    efficiency: dict[str, float]
    """Fraction of peak FLOP/s reached by a saturated layer of each class (FP32, PyTorch eager)."""
    backward_ratio: dict[str, float]
    """Backward time / forward time per class (≈2 for layers with weights: grad-input + grad-weight)."""
    sources: tuple[str, ...] = field(default=())

    @property
    def compute_label(self) -> str:
        """For tables: what computes, on which device, how fast at peak."""
        return f"{self.computes_on} ({self.product}, {self.peak_flops / 1e9:.0f} GFLOP/s peak)"

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_total_bytes - self.memory_reserved_bytes

    def forward_seconds(self, layer: LayerCost, batch: int, dtype_bytes: int = 4,
                        input_bytes_per_sample: int | None = None) -> float:
        """Seconds for one forward of `layer` over `batch` samples.

        `input_bytes_per_sample` is what the layer reads (the previous layer's boundary bytes);
        without it the layer is assumed to read as much as it writes.
        """
        cls = classify(layer, dtype_bytes)
        kernels = kernel_count(layer)
        written = layer.activation_bytes_per_sample
        elems = max(1.0, written / dtype_bytes / kernels)  # output elements per kernel, per sample
        n = batch * elems
        occupancy = n / math.hypot(n, self.saturation_elements)
        compute = batch * layer.forward_flops_per_sample / (self.peak_flops * self.efficiency[cls] * occupancy)
        read = written if input_bytes_per_sample is None else input_bytes_per_sample
        traffic = batch * (read + written) + layer.param_bytes
        memory = traffic / (self.memory_bandwidth_bytes_per_s * self.memory_efficiency)
        return kernels * self.op_overhead_s + max(compute, memory)

    def backward_seconds(self, layer: LayerCost, batch: int, dtype_bytes: int = 4,
                         input_bytes_per_sample: int | None = None) -> float:
        ratio = self.backward_ratio[classify(layer, dtype_bytes)]
        return ratio * self.forward_seconds(layer, batch, dtype_bytes, input_bytes_per_sample)

    def weight_grad_seconds(self, layer: LayerCost, batch: int, dtype_bytes: int = 4,
                            input_bytes_per_sample: int | None = None) -> float:
        """The part of `backward_seconds` that computes the layer's weight gradients (`weight_grad_share`)."""
        share = weight_grad_share(layer, dtype_bytes)
        return share * self.backward_seconds(layer, batch, dtype_bytes, input_bytes_per_sample)


# Shared efficiency tables (fraction of FP32 peak for a saturated layer); derivations in docs/presets.md.
_PASCAL_EFFICIENCY = {CONV: 0.55, DEPTHWISE: 0.10, MATMUL: 0.65, MEMORY: 0.05, BLOCK_CNN: 0.35, BLOCK_TRANSFORMER: 0.55}
_MAXWELL_EFFICIENCY = {**_PASCAL_EFFICIENCY, CONV: 0.50, MATMUL: 0.60, BLOCK_CNN: 0.32, BLOCK_TRANSFORMER: 0.50}
_VOLTA_EFFICIENCY = {**_PASCAL_EFFICIENCY, CONV: 0.65, MATMUL: 0.75, BLOCK_CNN: 0.40, BLOCK_TRANSFORMER: 0.65}
_CPU_EFFICIENCY = {CONV: 0.40, DEPTHWISE: 0.08, MATMUL: 0.55, MEMORY: 0.05, BLOCK_CNN: 0.25, BLOCK_TRANSFORMER: 0.45}
_BACKWARD_RATIO = {CONV: 2.0, DEPTHWISE: 2.0, MATMUL: 2.0, MEMORY: 1.5, BLOCK_CNN: 2.0, BLOCK_TRANSFORMER: 2.0}

_JETSON_SOURCES = ("developer.nvidia.com/embedded/downloads (GPU cores, max GPU clock, DRAM width and rate)",)

PRESETS: dict[str, DevicePreset] = {p.name: p for p in [
    DevicePreset(
        name="jetson-nano",
        description="NVIDIA Jetson Nano 4GB: 128-core Maxwell GPU @ 921.6 MHz, 4 GB 64-bit LPDDR4-3200",
        computes_on="GPU",
        product="Jetson Nano",
        peak_flops=128 * 2 * 921.6e6,           # 235.9 GFLOP/s FP32 (472 GFLOP/s FP16 in the datasheet)
        memory_total_bytes=4 * GiB,
        memory_reserved_bytes=int(1.5 * GiB),    # L4T (headless) + CUDA/cuDNN context + allocator slack
        memory_bandwidth_bytes_per_s=25.6e9,
        memory_efficiency=0.70,
        op_overhead_s=200e-6,                   # 4x Cortex-A57 @ 1.43 GHz drives PyTorch eager
        saturation_elements=1 * 2048 * 4,       # 1 SM x 2048 resident threads x ~4 outputs/thread
        efficiency=_MAXWELL_EFFICIENCY,
        backward_ratio=_BACKWARD_RATIO,
        sources=_JETSON_SOURCES + ("NVIDIA Jetson Nano module data sheet; Jetson Nano product page (472 GFLOPS FP16)",),
    ),
    DevicePreset(
        name="jetson-tx2",
        description="NVIDIA Jetson TX2 8GB: 256-core Pascal GPU @ 1.30 GHz, 8 GB 128-bit LPDDR4-1866",
        computes_on="GPU",
        product="Jetson TX2",
        peak_flops=256 * 2 * 1.3e9,             # 665.6 GFLOP/s FP32 (1.33 TFLOP/s FP16)
        memory_total_bytes=8 * GiB,
        memory_reserved_bytes=2 * GiB,
        memory_bandwidth_bytes_per_s=59.7e9,
        memory_efficiency=0.70,
        op_overhead_s=90e-6,                    # 2x Denver2 + 4x Cortex-A57 @ 2.0 GHz
        saturation_elements=2 * 2048 * 4,
        efficiency=_PASCAL_EFFICIENCY,
        backward_ratio=_BACKWARD_RATIO,
        sources=_JETSON_SOURCES + ("NVIDIA Jetson TX2 module data sheet; Jetson TX2 product page (1.33 TFLOPS FP16)",),
    ),
    DevicePreset(
        name="jetson-nx",
        description="NVIDIA Jetson Xavier NX 8GB: 384-core Volta GPU @ 1.10 GHz, 8 GB 128-bit LPDDR4x @ 1600 MHz",
        computes_on="GPU",
        product="Jetson Xavier NX",
        peak_flops=384 * 2 * 1.1e9,             # 844.8 GFLOP/s FP32
        memory_total_bytes=8 * GiB,
        memory_reserved_bytes=2 * GiB,
        memory_bandwidth_bytes_per_s=51.2e9,
        memory_efficiency=0.70,
        op_overhead_s=75e-6,                    # 6x Carmel @ 1.9 GHz
        saturation_elements=6 * 2048 * 4,
        efficiency=_VOLTA_EFFICIENCY,
        backward_ratio=_BACKWARD_RATIO,
        sources=_JETSON_SOURCES + ("NVIDIA Jetson Xavier NX module data sheet DA-09366-001 v1.3",),
    ),
    DevicePreset(
        name="jetson-orin-nano",
        description="NVIDIA Jetson Orin Nano 8GB: 1024-core Ampere GPU @ 625 MHz, 8 GB 128-bit LPDDR5 (68 GB/s)",
        computes_on="GPU",
        product="Jetson Orin Nano",
        peak_flops=1024 * 2 * 625e6,            # 1.28 TFLOP/s FP32 (original clocks, not the 2024 "Super" mode)
        memory_total_bytes=8 * GiB,
        memory_reserved_bytes=2 * GiB,
        memory_bandwidth_bytes_per_s=68e9,
        memory_efficiency=0.70,
        op_overhead_s=45e-6,                    # 6x Cortex-A78AE @ 1.5 GHz
        saturation_elements=8 * 1536 * 4,       # 8 SMs x 1536 resident threads (Ampere GA10x)
        efficiency=_VOLTA_EFFICIENCY,
        backward_ratio=_BACKWARD_RATIO,
        sources=_JETSON_SOURCES + ("NVIDIA Jetson Orin Nano series data sheet",),
    ),
    DevicePreset(
        name="rpi4",
        description="Raspberry Pi 4 Model B 4GB: 4x Cortex-A72 @ 1.5 GHz (NEON), 4 GB 32-bit LPDDR4-3200, CPU only",
        computes_on="CPU",
        product="Raspberry Pi 4",
        peak_flops=4 * 1.5e9 * 8,               # 48 GFLOP/s FP32: one 4-wide FMA per cycle per core
        memory_total_bytes=4 * GiB,
        memory_reserved_bytes=int(0.75 * GiB),  # Raspberry Pi OS Lite + Python/PyTorch runtime
        memory_bandwidth_bytes_per_s=12.8e9,
        memory_efficiency=0.35,                 # STREAM reaches ~4-5 GB/s on a Pi 4
        op_overhead_s=50e-6,
        saturation_elements=4 * 4 * 16,         # 4 cores x 4 FP32 lanes x 16-output register tile
        efficiency={**_CPU_EFFICIENCY, CONV: 0.30, MATMUL: 0.45},
        backward_ratio=_BACKWARD_RATIO,
        sources=("Raspberry Pi 4 Model B product brief (BCM2711, 4x A72 @ 1.5 GHz, LPDDR4-3200)",
                 "vfpbench on Cortex-A72: 8 FP32 FLOPs/cycle/core (wlog.flatlib.jp/2015/10/30/n1787/)"),
    ),
    DevicePreset(
        name="rpi4-8gb",
        description="Raspberry Pi 4 Model B 8GB: as rpi4 with 8 GB LPDDR4",
        computes_on="CPU",
        product="Raspberry Pi 4 8GB",
        peak_flops=4 * 1.5e9 * 8,
        memory_total_bytes=8 * GiB,
        memory_reserved_bytes=int(0.75 * GiB),
        memory_bandwidth_bytes_per_s=12.8e9,
        memory_efficiency=0.35,
        op_overhead_s=50e-6,
        saturation_elements=4 * 4 * 16,
        efficiency={**_CPU_EFFICIENCY, CONV: 0.30, MATMUL: 0.45},
        backward_ratio=_BACKWARD_RATIO,
        sources=("Raspberry Pi 4 Model B product brief (BCM2711, 4x A72 @ 1.5 GHz, LPDDR4-3200)",
                 "vfpbench on Cortex-A72: 8 FP32 FLOPs/cycle/core (wlog.flatlib.jp/2015/10/30/n1787/)"),
    ),
    DevicePreset(
        name="laptop-cpu",
        description="A 4-core laptop CPU (Intel Core i7-1165G7 class: AVX-512/2xFMA-256 @ 2.8 GHz all-core, "
                    "16 GB LPDDR4x-4266), CPU only, half the memory left to the desktop",
        computes_on="CPU",
        product="laptop",
        peak_flops=4 * 2.8e9 * 32,              # 358 GFLOP/s FP32: 32 FP32 FLOPs/cycle/core
        memory_total_bytes=16 * GiB,
        memory_reserved_bytes=8 * GiB,
        memory_bandwidth_bytes_per_s=68.3e9,
        memory_efficiency=0.50,
        op_overhead_s=12e-6,
        saturation_elements=4 * 16 * 16,        # 4 cores x 16 FP32 lanes x 16-output register tile
        efficiency=_CPU_EFFICIENCY,
        backward_ratio=_BACKWARD_RATIO,
        sources=("Intel ARK: Core i7-1165G7 (cores, base clock, memory types)",
                 "Intel 64 and IA-32 Optimization Reference Manual (FMA throughput per cycle)"),
    ),
]}


def get_preset(name: str, *, device: str | None = None, source: str | None = None) -> DevicePreset:
    """The preset called `name`, or `UnknownPreset` naming the device and the known presets."""
    try:
        return PRESETS[name]
    except KeyError:
        where = f"{source}: " if source else ""
        who = f"device {device!r}: " if device else ""
        raise UnknownPreset(f"{where}{who}unknown preset {shorten(repr(name))} (known: {', '.join(PRESETS)})") from None
