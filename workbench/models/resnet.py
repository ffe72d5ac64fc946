"""A torchvision-compatible ResNet-18/34 (``torchvision.models.resnet``'s module names, in-place ReLU and
``out += identity``), written here because torchvision cannot be installed beside the CPU torch build
without a matching wheel (see the README's constraints file). It is an ordinary ``nn.Module`` with a
free-form ``forward``: :func:`workbench.profiling.layering.split` turns it into layers like any user model.

``width`` scales the channel counts (64 in torchvision); ``small_input`` replaces the 7x7/2 stem and
the max-pool by a 3x3/1 convolution for 8x8 to 32x32 images.
"""

from __future__ import annotations

import torch
from torch import nn


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """``y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with torchvision's in-place ReLU."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with ``BasicBlock`` (stem, four stages ``layer1..layer4``, pool, fc)."""

    def __init__(
        self,
        blocks=(2, 2, 2, 2),
        num_classes: int = 1000,
        width: int = 64,
        in_channels: int = 3,
        small_input: bool = False,
    ):
        super().__init__()
        self.inplanes = width
        if small_input:
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if small_input else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, blocks[0])
        self.layer2 = self._make_layer(2 * width, blocks[1], stride=2)
        self.layer3 = self._make_layer(4 * width, blocks[2], stride=2)
        self.layer4 = self._make_layer(8 * width, blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000, width: int = 64, in_channels: int = 3, small_input: bool = False) -> ResNet:
    """ResNet-18 (torchvision's module names and structure; 11.7 M parameters at width 64, 1000 classes)."""
    return ResNet((2, 2, 2, 2), num_classes, width, in_channels, small_input)
