"""Image classifiers as layer lists: VGG-16, ResNet-50 (bottleneck-block granularity), AlexNet, MLP,
and a small 1-D CNN for MNIST-1D.

Each builder returns ``(layers, names)``. The paper configurations follow the published
architectures (Simonyan & Zisserman 2015, config D; He et al. 2016 with the stride on the 3x3
convolution as in torchvision's "v1.5"; Krizhevsky et al. 2012 in its single-tower torchvision
form). Mini configurations keep the layer structure and shrink channels, kernels and input size.

A convolution's output side is ``floor((n + 2p - k) / s) + 1``; max-pooling is applied only while
the feature map is larger than 1x1, so the same layer list works for 224x224 and 8x8 inputs.
"""

from __future__ import annotations

from torch import nn


def _out(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def _init(module: nn.Module) -> None:
    """He (Kaiming) normal init for ReLU networks: W ~ N(0, 2 / fan_in); zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------------- VGG
VGG16_CHANNELS: tuple[int | str, ...] = (1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M")  # x width


def vgg16(
    width: int = 64,
    hidden: int = 4096,
    image_size: int = 224,
    in_channels: int = 3,
    num_classes: int = 1000,
    *,
    dropout: float = 0.5,
    batch_norm: bool = False,
):
    """VGG-16 (config D): 13 conv3x3+ReLU layers (a 2x2 max-pool folded into the conv before it)
    and 3 fully connected layers = 16 layers. Paper size: 138.4M parameters.

    An image of side n affords floor(log2 n) halvings; when that is fewer than VGG's 5 pools the
    *first* pools are dropped (8x8 input: pools after blocks 3, 4, 5), so early layers keep the
    resolution. ``batch_norm`` adds BatchNorm after each conv (the VGG-16-BN variant)."""
    layers: list[nn.Module] = []
    names: list[str] = []
    c, side, block, idx = in_channels, image_size, 1, 1
    cfg = list(VGG16_CHANNELS)
    pools = [i for i, v in enumerate(cfg) if v == "M"]
    kept = set(pools[len(pools) - min(len(pools), max(image_size.bit_length() - 1, 0)) :])
    for i, v in enumerate(cfg):
        if v == "M":
            continue
        out = int(v) * width
        mods: list[nn.Module] = [nn.Conv2d(c, out, 3, padding=1)]
        if batch_norm:
            mods.append(nn.BatchNorm2d(out))
        mods.append(nn.ReLU(inplace=False))
        if i + 1 in kept:
            mods.append(nn.MaxPool2d(2))
            side //= 2
        layers.append(nn.Sequential(*mods))
        names.append(f"conv{block}_{idx}")
        c = out
        if i + 1 < len(cfg) and cfg[i + 1] == "M":
            block, idx = block + 1, 1
        else:
            idx += 1
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(c * side * side, hidden), nn.ReLU(), nn.Dropout(dropout)))
    layers.append(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout)))
    layers.append(nn.Linear(hidden, num_classes))
    names += ["fc6", "fc7", "fc8"]
    for layer in layers:
        _init(layer)
    return layers, names


# ------------------------------------------------------------------------------------ AlexNet
def alexnet(
    width: int = 64,
    hidden: int = 4096,
    image_size: int = 224,
    in_channels: int = 3,
    num_classes: int = 1000,
    *,
    dropout: float = 0.5,
    small_input: bool = False,
):
    """AlexNet: 5 conv layers (channels 64, 192, 384, 256, 256 for width=64) and 3 fully
    connected layers = 8 layers. Paper size (single tower, 224x224): 61.1M parameters.

    ``small_input`` replaces the 11x11/4 and 5x5 kernels by 3x3/1 and the 3x3/2 pools by 2x2/2
    (for 8x8 or 16x16 images)."""
    chans = [width, width * 3, width * 6, width * 4, width * 4]
    if small_input:
        convs = [(3, 1, 1)] * 5
        pool = (2, 2)
    else:
        convs = [(11, 4, 2), (5, 1, 2), (3, 1, 1), (3, 1, 1), (3, 1, 1)]
        pool = (3, 2)
    pool_after = {0, 1, 4}
    layers: list[nn.Module] = []
    names: list[str] = []
    c, side = in_channels, image_size
    for i, (out, (k, s, p)) in enumerate(zip(chans, convs)):
        mods: list[nn.Module] = [nn.Conv2d(c, out, k, stride=s, padding=p), nn.ReLU()]
        side = _out(side, k, s, p)
        if i in pool_after and side >= pool[0]:
            mods.append(nn.MaxPool2d(*pool))
            side = _out(side, pool[0], pool[1], 0)
        layers.append(nn.Sequential(*mods))
        names.append(f"conv{i + 1}")
        c = out
    layers.append(nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(c * side * side, hidden), nn.ReLU()))
    layers.append(nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU()))
    layers.append(nn.Linear(hidden, num_classes))
    names += ["fc6", "fc7", "fc8"]
    for layer in layers:
        _init(layer)
    return layers, names


# ------------------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    """y = ReLU(F(x) + S(x)), F = 1x1 -> 3x3 (stride) -> 1x1 (x4 channels), each conv with
    batch norm; S is the identity or a strided 1x1 conv + BN when the shape changes."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.residual = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.residual(x) + self.shortcut(x))


def resnet50(
    width: int = 64,
    image_size: int = 224,
    in_channels: int = 3,
    num_classes: int = 1000,
    blocks: tuple[int, ...] = (3, 4, 6, 3),
    *,
    small_input: bool = False,
    zero_init_residual: bool = False,
):
    """ResNet-50 at bottleneck-block granularity: stem, 16 bottleneck blocks, head = 18 layers.
    Paper size: 25.6M parameters. The residual sum stays inside a block, so every layer boundary
    carries one tensor. ``small_input`` uses a 3x3/1 stem without max-pool (for tiny images).
    ``zero_init_residual`` zeroes the last BN scale of every residual branch (Goyal et al. 2017)."""
    if small_input:
        stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
    else:
        stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    layers: list[nn.Module] = [stem]
    names, c = ["stem"], width
    for stage, n in enumerate(blocks):
        w = width * 2**stage
        for b in range(n):
            stride = 2 if (b == 0 and stage > 0) else 1
            layers.append(Bottleneck(c, w, stride))
            names.append(f"layer{stage + 1}.{b}")
            c = w * Bottleneck.expansion
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes)))
    names.append("fc")
    for layer in layers:
        for m in layer.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual and isinstance(layer, Bottleneck):
            last_bn = layer.residual[-1]
            assert isinstance(last_bn, nn.BatchNorm2d)
            nn.init.zeros_(last_bn.weight)  # each block starts as (ReLU of) its shortcut
    return layers, names


# ---------------------------------------------------------------------------------------- MLP
def mlp(depth: int = 8, width: int = 512, in_features: int = 512, num_classes: int = 10):
    """``depth`` layers of Linear+ReLU of ``width`` units; the first flattens its input to
    ``in_features``, the last also holds the ``width -> num_classes`` output projection, so all
    layers cost about the same (a balanced pipeline benchmark)."""
    if depth < 1:
        raise ValueError(f"mlp depth must be >= 1, got {depth}")
    layers: list[nn.Module] = []
    names: list[str] = []
    for i in range(depth):
        mods: list[nn.Module] = [nn.Flatten()] if i == 0 else []
        mods += [nn.Linear(in_features if i == 0 else width, width), nn.ReLU()]
        if i == depth - 1:
            mods.append(nn.Linear(width, num_classes))
        layers.append(nn.Sequential(*mods))
        names.append(f"fc{i}")
    for layer in layers:
        _init(layer)
    return layers, names


def cnn1d(channels: int = 32, length: int = 40, num_classes: int = 10):
    """A small 1-D CNN for MNIST-1D (Greydanus 2020), one layer per pipeline stage of a 4-stage
    split: three Conv1d+ReLU (kernel 5, 3, 3; stride 2, so the signal shrinks
    ``n -> floor((n + 2p - k) / 2) + 1``: 40 -> 20 -> 10 -> 5) and a linear classifier over the
    flattened ``channels x 5`` features. About 7k parameters at 32 channels."""
    if channels < 1 or length < 8:
        raise ValueError(f"cnn1d needs channels >= 1 and length >= 8, got channels={channels}, length={length}")
    layers, names, n, c = [], [], length, 1
    for i, (k, p) in enumerate(((5, 2), (3, 1), (3, 1))):
        layers.append(nn.Sequential(nn.Conv1d(c, channels, k, stride=2, padding=p), nn.ReLU()))
        names.append(f"conv{i + 1}")
        n, c = _out(n, k, 2, p), channels
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(channels * n, num_classes)))
    names.append("fc")
    for layer in layers:
        _init(layer)
    return layers, names
