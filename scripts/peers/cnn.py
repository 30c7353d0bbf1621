"""ResNet-18 and MobileNetV2 (torchvision's architectures) over :mod:`peers.xp`.

Weights come from the torch module's state_dict; strides, paddings and groups from its Conv2d
modules. Batch norm is not folded into the convolution, as torch's eval mode does not fold it: it
runs as ``x * scale + shift`` with scale and shift computed from its running statistics at load.
"""

from __future__ import annotations

import numpy as np


def _layers(module) -> tuple[dict, dict, dict]:
    """state_dict as float32 NumPy, Conv2d hyperparameters by name, BatchNorm eps by name."""
    import torch

    sd = {k: v.detach().numpy().astype(np.float32) for k, v in module.state_dict().items() if v.is_floating_point()}
    convs, eps = {}, {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Conv2d):
            convs[name] = (m.stride[0], m.padding[0], m.groups)
        elif isinstance(m, torch.nn.BatchNorm2d):
            eps[name] = m.eps
    return sd, convs, eps


class _Loader:
    def __init__(self, ops, module):
        self.ops = ops
        self.sd, self.convs, self.eps = _layers(module)
        self.params: dict = {}

    def conv(self, name: str) -> tuple:
        """Registers the conv's weight; returns (name, stride, padding, groups) for the forward."""
        self.params[name] = self.ops.conv_weight(self.sd[f"{name}.weight"])
        return (name, *self.convs[name])

    def bn(self, name: str) -> str:
        scale = self.sd[f"{name}.weight"] / np.sqrt(self.sd[f"{name}.running_var"] + self.eps[name])
        shift = self.sd[f"{name}.bias"] - self.sd[f"{name}.running_mean"] * scale
        self.params[name] = (self.ops.asarray(scale), self.ops.asarray(shift))
        return name

    def linear(self, name: str) -> str:
        self.params[name] = (self.ops.asarray(self.sd[f"{name}.weight"].T), self.ops.asarray(self.sd[f"{name}.bias"]))
        return name


def _conv(ops, p, x, spec):
    name, stride, padding, groups = spec
    return ops.conv2d(x, p[name], stride, padding, groups)


def _bn(p, x, name):
    scale, shift = p[name]
    return x * scale + shift


def _linear(p, x, name):
    w, b = p[name]
    return x @ w + b


def resnet18(ops, module):
    """``(forward(params, x_nhwc) -> (logits,), params)`` for torchvision's ResNet-18 ``module``."""
    ld = _Loader(ops, module)
    stem = (ld.conv("conv1"), ld.bn("bn1"))
    blocks = []
    for layer in range(1, 5):
        j = 0
        while f"layer{layer}.{j}.conv1.weight" in ld.sd:
            b = f"layer{layer}.{j}"
            down = (ld.conv(f"{b}.downsample.0"), ld.bn(f"{b}.downsample.1")) if f"{b}.downsample.0.weight" in ld.sd else None
            blocks.append((ld.conv(f"{b}.conv1"), ld.bn(f"{b}.bn1"), ld.conv(f"{b}.conv2"), ld.bn(f"{b}.bn2"), down))
            j += 1
    fc = ld.linear("fc")

    def forward(p, x):
        x = ops.relu(_bn(p, _conv(ops, p, x, stem[0]), stem[1]))
        x = ops.max_pool(x, 3, 2, 1)
        for c1, b1, c2, b2, down in blocks:
            out = ops.relu(_bn(p, _conv(ops, p, x, c1), b1))
            out = _bn(p, _conv(ops, p, out, c2), b2)
            identity = x if down is None else _bn(p, _conv(ops, p, x, down[0]), down[1])
            x = ops.relu(out + identity)
        return (_linear(p, x.mean(axis=(1, 2)), fc),)

    return forward, ld.params


def mobilenet_v2(ops, module):
    """``(forward(params, x_nhwc) -> (logits,), params)`` for torchvision's MobileNetV2 ``module``."""
    ld = _Loader(ops, module)
    features = []  # ("cbr", conv, bn) for Conv-BN-ReLU6, ("block", residual, [steps]) for inverted residuals
    i = 0
    while f"features.{i}.0.weight" in ld.sd or f"features.{i}.conv.0.0.weight" in ld.sd:
        f = f"features.{i}"
        if f"{f}.0.weight" in ld.sd:
            features.append(("cbr", ld.conv(f"{f}.0"), ld.bn(f"{f}.1")))
        else:
            steps, j = [], 0
            while f"{f}.conv.{j}.0.weight" in ld.sd:  # Conv-BN-ReLU6 (expand, depthwise)
                steps.append(("cbr", ld.conv(f"{f}.conv.{j}.0"), ld.bn(f"{f}.conv.{j}.1")))
                j += 1
            steps.append(("cb", ld.conv(f"{f}.conv.{j}"), ld.bn(f"{f}.conv.{j + 1}")))  # linear projection
            features.append(("block", bool(module.features[i].use_res_connect), steps))
        i += 1
    classifier = ld.linear("classifier.1")

    def cbr(p, x, step):
        kind, conv, bn = step
        y = _bn(p, _conv(ops, p, x, conv), bn)
        return ops.relu6(y) if kind == "cbr" else y

    def forward(p, x):
        for feature in features:
            if feature[0] == "cbr":
                x = cbr(p, x, feature)
                continue
            _, residual, steps = feature
            y = x
            for step in steps:
                y = cbr(p, y, step)
            x = x + y if residual else y
        return (_linear(p, x.mean(axis=(1, 2)), classifier),)  # dropout: identity in eval

    return forward, ld.params
