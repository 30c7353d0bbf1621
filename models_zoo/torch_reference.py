"""Reference torch.nn models for tests, benchmarks and the main job: ResNet-18 and MobileNetV2
(torchvision's architectures, written here because torchvision is not a dependency), a GPT-2 style
language model (the architecture of ``models_zoo.create_gpt``), OpenAI CLIP's ModifiedResNet
(the ResNet image tower of ``examples.clip``), small BERT and GPT-2 from
transformers configs with random weights, and ONNX export through both torch exporters.

>>> m = resnet18(num_classes=10).eval()
>>> tuple(m(torch.zeros(1, 3, 32, 32)).shape)
(1, 10)
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

EXPORTERS = ("torchscript", "dynamo")
OPSET = 18


# -- ResNet-18 (torchvision.models.resnet18) --------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * BasicBlock.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * BasicBlock.expansion),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet((2, 2, 2, 2), num_classes)


# -- MobileNetV2 (torchvision.models.mobilenet_v2) --------------------------------------------
def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:  # rounding down must not lose more than 10%
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    def __init__(self, inp: int, oup: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(inp, oup, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(oup),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # t (expansion), c (channels), n (repeats), s (first stride)
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, round_nearest: int = 8, dropout: float = 0.2):
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in self.SETTINGS:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes)


def _randomize_batchnorm(model: nn.Module, seed: int) -> None:
    # Fresh BNs are identities; random statistics make the exported Bn/fused Conv carry real numbers.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)


# -- GPT-2 style language model (models_zoo.create_gpt's architecture) -------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, dims: int, num_heads: int, block_size: int, bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.c_attn = nn.Linear(dims, 3 * dims, bias=bias)  # query, key, value in one projection
        self.c_proj = nn.Linear(dims, dims, bias=bias)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        n, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.num_heads, c // self.num_heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(n, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dims: int, num_heads: int, block_size: int, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dims, bias=bias)
        self.attn = CausalSelfAttention(dims, num_heads, block_size, bias)
        self.ln_2 = nn.LayerNorm(dims, bias=bias)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(dims, 4 * dims, bias=bias),
                                  "c_proj": nn.Linear(4 * dims, dims, bias=bias)})

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = nn.functional.gelu(self.mlp["c_fc"](self.ln_2(x)), approximate="tanh")
        return x + self.mlp["c_proj"](h)


class GPT(nn.Module):
    """GPT-2 (pre-LN blocks, learned positions, tanh GELU, lm_head tied to the token embedding)."""

    def __init__(self, bias: bool, block_size: int, dims: int, num_heads: int, num_layers: int, vocab_size: int):
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab_size, dims),
            "wpe": nn.Embedding(block_size, dims),
            "h": nn.ModuleList(GPTBlock(dims, num_heads, block_size, bias) for _ in range(num_layers)),
            "ln_f": nn.LayerNorm(dims, bias=bias),
        })
        self.lm_head = nn.Linear(dims, vocab_size, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer["wte"](idx) + self.transformer["wpe"](torch.arange(t, device=idx.device))
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))


# -- CLIP's ModifiedResNet (OpenAI CLIP's ResNet image tower; open_clip.modified_resnet) --------
class CLIPBottleneck(nn.Module):
    """1x1, 3x3, 1x1 (x4) convolutions; a stride > 1 is an average pool after the 3x3 convolution
    and on the shortcut before its 1x1 convolution (anti-aliased downsampling)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.avgpool = nn.AvgPool2d(stride) if stride > 1 else nn.Identity()
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.downsample = None
        if stride > 1 or inplanes != planes * self.expansion:
            self.downsample = nn.Sequential()
            self.downsample.add_module("-1", nn.AvgPool2d(stride))
            self.downsample.add_module("0", nn.Conv2d(inplanes, planes * self.expansion, 1, bias=False))
            self.downsample.add_module("1", nn.BatchNorm2d(planes * self.expansion))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(self.avgpool(out)))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


class CLIPAttentionPool2d(nn.Module):
    """The mean of the feature map prepended to its positions, plus positional embeddings,
    through one multi-head attention; the mean token's output is the pooled feature."""

    def __init__(self, spacial_dim: int, embed_dim: int, num_heads: int, output_dim: int):
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.randn(spacial_dim ** 2 + 1, embed_dim) / embed_dim ** 0.5)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.c_proj = nn.Linear(embed_dim, output_dim)
        self.num_heads = num_heads

    def forward(self, x):
        x = x.flatten(start_dim=2).permute(2, 0, 1)  # [N, C, H, W] -> [H*W, N, C]
        x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0) + self.positional_embedding[:, None, :]
        x, _ = nn.functional.multi_head_attention_forward(
            query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=self.num_heads,
            q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight, v_proj_weight=self.v_proj.weight,
            in_proj_weight=None, in_proj_bias=torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
            bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=self.c_proj.weight,
            out_proj_bias=self.c_proj.bias, use_separate_proj_weight=True, training=self.training,
            need_weights=False)
        return x[0]


class ModifiedResNet(nn.Module):
    """OpenAI CLIP's ResNet image tower: a stem of three 3x3 convolutions and a 2x2 average pool,
    four stages of :class:`CLIPBottleneck`, and :class:`CLIPAttentionPool2d`. Module names are
    OpenAI's (``conv1``..``bn3``, ``layer1.0.downsample.0``, ``attnpool.q_proj``), so its
    ``state_dict`` is the ``visual.*`` part of a CLIP checkpoint.

    >>> m = ModifiedResNet((1, 1, 1, 1), output_dim=16, heads=4, input_resolution=64, width=8).eval()
    >>> tuple(m(torch.zeros(2, 3, 64, 64)).shape)
    (2, 16)
    """

    def __init__(self, layers, output_dim: int, heads: int, input_resolution: int = 224, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width // 2, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width // 2)
        self.conv2 = nn.Conv2d(width // 2, width // 2, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width // 2)
        self.conv3 = nn.Conv2d(width // 2, width, kernel_size=3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.avgpool = nn.AvgPool2d(2)
        inplanes = width
        for i, count in enumerate(layers):
            planes = width * 2 ** i
            blocks = [CLIPBottleneck(inplanes, planes, stride=2 if i > 0 else 1)]
            inplanes = planes * CLIPBottleneck.expansion
            blocks += [CLIPBottleneck(inplanes, planes) for _ in range(1, count)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.attnpool = CLIPAttentionPool2d(input_resolution // 32, width * 32, heads, output_dim)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = self.avgpool(torch.relu(self.bn3(self.conv3(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.attnpool(x)


# -- transformers ----------------------------------------------------------------------------
def small_bert(seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        vocab_size=1000, max_position_embeddings=512, attn_implementation="eager")
    return BertModel(config, add_pooling_layer=True).eval()


def _bert(seed: int, hidden: int, heads: int) -> nn.Module:
    """A 4-layer BertModel of ``hidden`` (feed-forward 4x) and BERT's vocabulary; seeded random weights."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(hidden_size=hidden, num_hidden_layers=4, num_attention_heads=heads,
                        intermediate_size=4 * hidden, vocab_size=30522, max_position_embeddings=512,
                        attn_implementation="eager")
    return BertModel(config, add_pooling_layer=True).eval()


def _gpt2(seed: int, **sizes) -> nn.Module:
    """A GPT2LMHeadModel of ``sizes`` (GPT2Config's; GPT-2 124M's where left out), its embedding
    tied to the LM head; seeded random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**sizes, use_cache=False, attn_implementation="eager")).eval()


def small_gpt2(seed: int = 0) -> nn.Module:
    return _gpt2(seed, n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=256)


def bert_small(seed: int = 0) -> nn.Module:
    """BERT-Small's shape (Turc et al. 2019, google/bert_uncased_L-4_H-512_A-8): 4 layers, hidden 512,
    8 heads, BERT's vocabulary; seeded random weights."""
    return _bert(seed, 512, 8)


def gpt2_124m(seed: int = 0) -> nn.Module:
    """GPT-2 at its released smallest size (124M parameters: 12 layers, hidden 768, 12 heads, the
    50,257-token vocabulary, the tied LM head); seeded random weights."""
    return _gpt2(seed)


def bert_mini(seed: int = 0) -> nn.Module:
    """BERT-Mini's shape (Turc et al. 2019, google/bert_uncased_L-4_H-256_A-4): 4 layers, hidden 256,
    4 heads, BERT's vocabulary; seeded random weights."""
    return _bert(seed, 256, 4)


def gpt2_mini(seed: int = 0) -> nn.Module:
    """GPT-2 with BERT-Mini's shape (4 layers, hidden 256, 4 heads) and GPT-2's 50,257-token
    vocabulary, the embedding tied to the LM head; seeded random weights."""
    return _gpt2(seed, n_embd=256, n_layer=4, n_head=4)


class _TupleOutput(nn.Module):
    """transformers models return ModelOutput dicts; exporters want tensors with fixed names."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return tuple(out[k] for k in self.keys)


# -- the model table -------------------------------------------------------------------------
@dataclass
class ModelSpec:
    """A model ready to export: module, example inputs by name, output names, dynamic axes."""

    name: str
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]

    def numpy_inputs(self, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs like the example ones with batch size ``batch`` (other dims kept)."""
        rng = np.random.default_rng(seed)
        out = {}
        for k, t in self.inputs.items():
            shape = (batch, *t.shape[1:])
            if t.dtype.is_floating_point:
                out[k] = rng.standard_normal(shape).astype(np.float32)
            elif k == "attention_mask":
                mask = np.ones(shape, np.int64)
                mask[:, shape[1] - shape[1] // 4:] = 0  # padded tail exercises the mask path
                mask[0, :] = 1
                out[k] = mask
            else:
                out[k] = rng.integers(0, 1000, shape).astype(np.int64)
        return out


def _image_spec(name: str, module: nn.Module, size: int, seed: int) -> ModelSpec:
    _randomize_batchnorm(module, seed)
    module.eval()
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, 3, size, size)).astype(np.float32))
    return ModelSpec(name, module, {"input": x}, ("output",), {"input": {0: "batch"}, "output": {0: "batch"}})


def _text_spec(name: str, module: nn.Module, keys: tuple[str, ...], seq: int) -> ModelSpec:
    ids = torch.randint(0, 1000, (2, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, seq, dtype=torch.int64)
    axes = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}}
    axes.update({k: {0: "batch"} for k in keys})
    return ModelSpec(name, _TupleOutput(module, keys).eval(), {"input_ids": ids, "attention_mask": mask}, keys, axes)


def build(name: str, image_size: int = 64, seq: int = 16, seed: int = 0) -> ModelSpec:
    """One of ``resnet18``, ``mobilenet_v2``, ``bert``, ``gpt2`` (small configurations, for tests) or
    ``bert_small``, ``gpt2_124m`` (the published sizes, for benchmarks), ``bert_mini``, ``gpt2_mini``
    (hidden 256, 4 layers: scripts/bench.py --ggml-load) with seeded random weights."""
    torch.manual_seed(seed)
    if name == "resnet18":
        return _image_spec(name, resnet18(), image_size, seed)
    if name == "mobilenet_v2":
        return _image_spec(name, mobilenet_v2(), image_size, seed)
    if name == "bert":
        return _text_spec(name, small_bert(seed), ("last_hidden_state", "pooler_output"), seq)
    if name == "gpt2":
        return _text_spec(name, small_gpt2(seed), ("logits",), seq)
    if name == "bert_small":
        return _text_spec(name, bert_small(seed), ("last_hidden_state", "pooler_output"), seq)
    if name == "gpt2_124m":
        return _text_spec(name, gpt2_124m(seed), ("logits",), seq)
    if name == "bert_mini":
        return _text_spec(name, bert_mini(seed), ("last_hidden_state", "pooler_output"), seq)
    if name == "gpt2_mini":
        return _text_spec(name, gpt2_mini(seed), ("logits",), seq)
    raise KeyError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES + LARGE_MODEL_NAMES + MINI_MODEL_NAMES)}")


MODEL_NAMES = ("resnet18", "mobilenet_v2", "bert", "gpt2")
LARGE_MODEL_NAMES = ("bert_small", "gpt2_124m")  # the C backend's benchmark models (scripts/bench.py)
MINI_MODEL_NAMES = ("bert_mini", "gpt2_mini")  # GGML under load (scripts/bench.py --ggml-load)


# -- export ----------------------------------------------------------------------------------
def export_onnx(spec: ModelSpec, exporter: str, path: str | None = None, opset: int = OPSET) -> bytes:
    """Export with ``torchscript`` (torch.onnx.export dynamo=False) or ``dynamo``; the batch axis is dynamic.

    Returns the serialized ModelProto (and writes it to ``path`` when given).
    """
    args = tuple(spec.inputs.values())
    names = list(spec.inputs)
    with torch.no_grad():
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(spec.module, args, buf, input_names=names, output_names=list(spec.output_names),
                              dynamic_axes=spec.dynamic_axes, opset_version=opset, dynamo=False)
            data = buf.getvalue()
        elif exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=1024)
            dynamic_shapes = tuple({0: batch} for _ in names)  # positional: forward's arg names differ
            program = torch.onnx.export(spec.module, args, input_names=names, output_names=list(spec.output_names),
                                        dynamic_shapes=dynamic_shapes, opset_version=opset, dynamo=True,
                                        optimize=True, verbose=False)
            data = program.model_proto.SerializeToString()
        else:
            raise ValueError(f"unknown exporter {exporter!r}; choose from {EXPORTERS}")
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data
