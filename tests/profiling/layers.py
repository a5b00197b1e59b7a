"""A small synthetic layer sequence (a conv net with every layer class) for preset tests.

Numbers are per sample, fp32, as the zoo records them: `activation_bytes` is what the layer
writes, `boundary_bytes` what crosses a cut after it.
"""

from __future__ import annotations

from hppctl.models.profile import LayerCost


def conv(name: str, cin: int, cout: int, hw: int, k: int = 3, groups: int = 1) -> LayerCost:
    out = cout * hw * hw * 4
    return LayerCost(name=name, kind="Conv2d", boundary_bytes_per_sample=out, activation_bytes_per_sample=out,
                     param_bytes=cout * (cin // groups) * k * k * 4,
                     forward_flops_per_sample=2 * cout * hw * hw * (cin // groups) * k * k)


def elementwise(name: str, kind: str, channels: int, hw: int, params: int = 0) -> LayerCost:
    out = channels * hw * hw * 4
    return LayerCost(name=name, kind=kind, boundary_bytes_per_sample=out, activation_bytes_per_sample=out,
                     param_bytes=params, forward_flops_per_sample=2 * channels * hw * hw)


def linear(name: str, fin: int, fout: int) -> LayerCost:
    return LayerCost(name=name, kind="Linear", boundary_bytes_per_sample=fout * 4, activation_bytes_per_sample=fout * 4,
                     param_bytes=(fin + 1) * fout * 4, forward_flops_per_sample=2 * fin * fout)


def small_cnn() -> list[LayerCost]:
    """conv-bn-relu, depthwise conv-bn-relu, pointwise conv, pool, linear: 9 layers, 32x32 input."""
    return [
        conv("stem", 3, 32, 16),
        elementwise("stem.bn", "BatchNorm2d", 32, 16, params=2 * 32 * 4),
        elementwise("stem.act", "ReLU6", 32, 16),
        conv("dw", 32, 32, 16, groups=32),
        elementwise("dw.bn", "BatchNorm2d", 32, 16, params=2 * 32 * 4),
        elementwise("dw.act", "ReLU6", 32, 16),
        conv("pw", 32, 128, 16, k=1),
        LayerCost(name="pool", kind="AdaptiveAvgPool2d", boundary_bytes_per_sample=128 * 4,
                  activation_bytes_per_sample=128 * 4, param_bytes=0, forward_flops_per_sample=128 * 256),
        linear("fc", 128, 10),
    ]


def block_of(parts: list[LayerCost], name: str, kind: str) -> LayerCost:
    """The block-granularity layer made of `parts` (as the zoo's block layers are)."""
    return LayerCost(
        name=name, kind=kind, boundary_bytes_per_sample=parts[-1].boundary_bytes_per_sample,
        activation_bytes_per_sample=sum(p.activation_bytes_per_sample for p in parts),
        param_bytes=sum(p.param_bytes for p in parts),
        forward_flops_per_sample=sum(p.forward_flops_per_sample for p in parts),
    )
