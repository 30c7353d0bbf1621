"""002 multi-backend deployment, "CLIP Model across Backends": ``examples.clip.model.clip``.

Small configurations of both image towers are checked against references given the same
weights: the ViT variant end to end against transformers' ``CLIPModel``; the ResNet variant's
image tower against ``models_zoo.torch_reference.ModifiedResNet`` (OpenAI's architecture; open_clip
needs torchvision, whose PyPI wheel does not load against the pinned CPU torch) and its text tower
against ``CLIPModel``'s. Then every Python backend, compiled as the guide compiles, gives the
reference's numbers; the ONNX export gives Mithril's under onnxruntime; and the guide's own
full-size call builds and compiles.

Tolerances: everything runs in float32 with features of magnitude ~1 and logits up to
exp(logit_scale) ~ 14; differences come from summation order in convolutions, matmuls and
softmax, measured at ~1e-6 relative. ``rtol=1e-4`` with ``atol=1e-4 * max|reference|`` leaves
two orders of margin and still catches any wrong weight, layout or pooling position (those move
results by 1e-2 or more).
"""

from __future__ import annotations

import doctest
import functools

import numpy as np
import pytest

import mithril as ml
from examples.clip import model as clip_module
from examples.clip import weights as clip_weights
from examples.clip.model import clip
from mithril.errors import ModelError

torch = pytest.importorskip("torch", reason="the references are torch modules (transformers' CLIPModel, ModifiedResNet)")
transformers = pytest.importorskip("transformers", reason="the ViT and text references are transformers' CLIPModel")
from models_zoo.torch_reference import ModifiedResNet, _randomize_batchnorm  # noqa: E402

OUTPUTS = ("image_features", "text_features", "logits_per_image", "logits_per_text")
TEXT = dict(context_length=12, vocab_size=100, transformer_width=32, transformer_heads=2, transformer_layers=2)
CONFIGS = {
    "vit": dict(embed_dim=32, image_resolution=32, vision_layers=2, vision_width=128, vision_patch_size=8, **TEXT),
    "resnet": dict(embed_dim=32, image_resolution=64, vision_layers=(1, 2, 1, 1), vision_width=8,
                   vision_patch_size=0, **TEXT),
}
N_IMAGES, N_TEXTS = 2, 3
EOT = TEXT["vocab_size"] - 1  # CLIP's end-of-text token is the largest id


def _backends():
    """The guide's four backends, made as it makes them."""
    return {
        "numpy": lambda: ml.NumpyBackend(),
        "torch": lambda: ml.TorchBackend(device="cuda" if torch.cuda.is_available() else "cpu"),
        "jax": lambda: ml.JaxBackend(),
        "mlx": lambda: ml.MlxBackend(),
    }


def _backend(name: str):
    try:
        return _backends()[name]()
    except ml.MithrilError as exc:
        pytest.skip(f"the {name} backend cannot be created here: {exc}")


def _data(resolution: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    image = rng.standard_normal((N_IMAGES, 3, resolution, resolution)).astype(np.float32)
    text = rng.integers(1, EOT, (N_TEXTS, TEXT["context_length"])).astype(np.int64)
    for row, eot in enumerate([4, 11, 7]):  # EOT at different places, zero padding after it
        text[row, eot] = EOT
        text[row, eot + 1:] = 0
    return {"image": image, "text": text}


@functools.lru_cache(maxsize=None)
def _hf_clip():
    """transformers' CLIPModel of the ViT configuration, weights perturbed off their init (so
    LayerNorms and biases are not ones and zeros)."""
    vit = CONFIGS["vit"]
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=TEXT["vocab_size"], hidden_size=TEXT["transformer_width"],
                         intermediate_size=4 * TEXT["transformer_width"],
                         num_hidden_layers=TEXT["transformer_layers"], num_attention_heads=TEXT["transformer_heads"],
                         max_position_embeddings=TEXT["context_length"], eos_token_id=EOT, bos_token_id=EOT - 1,
                         pad_token_id=0),
        vision_config=dict(hidden_size=vit["vision_width"], intermediate_size=4 * vit["vision_width"],
                           num_hidden_layers=vit["vision_layers"], num_attention_heads=vit["vision_width"] // 64,
                           image_size=vit["image_resolution"], patch_size=vit["vision_patch_size"]),
        projection_dim=vit["embed_dim"])
    torch.manual_seed(0)
    model = transformers.CLIPModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _logits(image_features: np.ndarray, text_features: np.ndarray, logit_scale: float) -> tuple:
    image = image_features / np.linalg.norm(image_features, axis=-1, keepdims=True)
    text = text_features / np.linalg.norm(text_features, axis=-1, keepdims=True)
    per_image = np.exp(logit_scale) * image @ text.T
    return per_image, per_image.T


@functools.lru_cache(maxsize=None)
def _case(variant: str):
    """(params, data, reference outputs) of one variant."""
    hf = _hf_clip()
    data = _data(CONFIGS[variant]["image_resolution"])
    image, text = (torch.from_numpy(data[k]) for k in ("image", "text"))
    with torch.no_grad():
        text_features = hf.get_text_features(input_ids=text).pooler_output.numpy()
        if variant == "vit":
            out = hf(input_ids=text, pixel_values=image)
            image_features = hf.get_image_features(pixel_values=image).pooler_output.numpy()
            ref = dict(image_features=image_features, text_features=text_features,
                       logits_per_image=out.logits_per_image.numpy(), logits_per_text=out.logits_per_text.numpy())
            # transformers' normalized embeddings are the features divided by their norms
            np.testing.assert_allclose(out.image_embeds.numpy(),
                                       image_features / np.linalg.norm(image_features, axis=-1, keepdims=True),
                                       rtol=1e-5, atol=1e-6)
            return clip_weights.hf_params(hf.state_dict()), data, ref
        cfg = CONFIGS["resnet"]
        torch.manual_seed(1)
        resnet = ModifiedResNet(cfg["vision_layers"], cfg["embed_dim"], heads=cfg["vision_width"] * 32 // 64,
                                input_resolution=cfg["image_resolution"], width=cfg["vision_width"])
        _randomize_batchnorm(resnet, seed=2)
        resnet.eval()
        image_features = resnet(image).numpy()
    text_params = {k: v for k, v in clip_weights.hf_params(hf.state_dict()).items() if not k.startswith("visual.")}
    params = {**text_params, **clip_weights.openai_params({f"visual.{k}": v for k, v in resnet.state_dict().items()})}
    per_image, per_text = _logits(image_features, text_features, float(hf.logit_scale.detach()))
    ref = dict(image_features=image_features, text_features=text_features, logits_per_image=per_image,
               logits_per_text=per_text)
    return params, data, ref


def _assert_close(got: dict, ref: dict) -> None:
    for key in OUTPUTS:
        assert got[key].shape == ref[key].shape and got[key].dtype == np.float32, key
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-4 * float(np.abs(ref[key]).max()),
                                   err_msg=key)


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_clip_parameters_are_the_references_names(variant):
    """002, "CLIP Model across Backends": the ViT variant's parameters are exactly those a
    transformers CLIPModel maps onto; the ResNet variant's image tower those of OpenAI's
    ModifiedResNet state_dict under ``visual.``, BatchNorm statistics included."""
    params, data, _ = _case(variant)
    pm = ml.compile(clip(**CONFIGS[variant]), ml.NumpyBackend(), shapes={k: list(v.shape) for k, v in data.items()},
                    data_keys={"image", "text"})
    assert sorted(pm.parameter_keys) == sorted(params)
    assert "visual.attnpool.c_proj.weight" in params if variant == "resnet" else "visual.proj" in params
    assert sorted(pm.input_keys) == ["image", "text"] and sorted(pm.output_keys) == sorted(OUTPUTS)


@pytest.mark.parametrize("backend_name", list(_backends()))
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_clip_matches_references_on_every_backend(variant, backend_name):
    """002, "CLIP Model across Backends": ``ml.compile(clip_model, backend, shapes=shapes,
    data_keys={"image", "text"})`` on each backend gives the references' image and text features
    and logits (transformers' CLIPModel; ModifiedResNet for the ResNet image tower)."""
    params, data, ref = _case(variant)
    backend = _backend(backend_name)
    clip_model = clip(**CONFIGS[variant])
    shapes = {"image": list(data["image"].shape), "text": list(data["text"].shape)}
    compiled = ml.compile(clip_model, backend, shapes=shapes, data_keys={"image", "text"})
    out = compiled.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                            {k: backend.from_numpy(v) for k, v in data.items()})
    _assert_close({k: backend.to_numpy(out[k]) for k in OUTPUTS}, ref)


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_clip_onnx_export_matches_onnxruntime(variant):
    """002, "CLIP Model across Backends": the same model exported with ``ml.export_onnx`` runs
    under onnxruntime and gives Mithril's numbers (and so the references')."""
    ort = pytest.importorskip("onnxruntime")
    params, data, ref = _case(variant)
    clip_model = clip(**CONFIGS[variant])
    shapes = {k: list(v.shape) for k, v in data.items()}
    proto = ml.export_onnx(clip_model, shapes=shapes, params=params)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert sorted(names) == sorted(OUTPUTS)
    got = dict(zip(names, session.run(None, data)))
    mithril = ml.compile(clip_model, ml.NumpyBackend(), shapes=shapes, data_keys={"image", "text"}).evaluate(params, data)
    for key in OUTPUTS:
        np.testing.assert_allclose(got[key], mithril[key], rtol=1e-5, atol=1e-5 * float(np.abs(ref[key]).max()),
                                   err_msg=key)
    _assert_close(got, ref)


def _openai_parameter_count(embed_dim: int) -> int:
    """Parameters of OpenAI's CLIP with the RN50 towers and ``embed_dim``, counted on torch
    modules of its architecture (BatchNorm statistics are buffers there, not parameters)."""
    visual = ModifiedResNet((3, 4, 6, 3), embed_dim, heads=32, input_resolution=224, width=64)
    width, layers = 512, 12
    block = [torch.nn.MultiheadAttention(width, 8), torch.nn.LayerNorm(width), torch.nn.LayerNorm(width),
             torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)]
    per_block = sum(p.numel() for m in block for p in m.parameters())
    text = (49408 * width + 77 * width + layers * per_block + 2 * width  # embeddings, blocks, ln_final
            + width * embed_dim + 1)  # text_projection, logit_scale
    return sum(p.numel() for p in visual.parameters()) + text


def _counts(pm) -> tuple[int, int]:
    """(all parameters, trainable ones: all less the BatchNorm running statistics)."""
    sizes = {k: int(np.prod(np.shape(v))) for k, v in pm.get_parameters().items()}
    return sum(sizes.values()), sum(n for k, n in sizes.items() if k not in pm.buffer_keys)


def test_document_full_size_clip_compiles_and_runs_on_numpy():
    """002, "CLIP Model across Backends": the guide's call as written (RN50's towers with
    embed_dim=512) builds, compiles with its shapes and data_keys, and evaluates once; its
    parameter count is that of OpenAI's CLIP with the same arguments."""
    clip_model = clip(
        embed_dim=512,
        image_resolution=224,
        vision_layers=(3, 4, 6, 3),  # ResNet-50
        vision_width=64,
        vision_patch_size=0,
        context_length=77,
        vocab_size=49408,
        transformer_width=512,
        transformer_heads=8,
        transformer_layers=12,
    )
    shapes = {"image": [1, 3, 224, 224], "text": [1, 77]}
    numpy_clip = ml.compile(clip_model, ml.NumpyBackend(), shapes=shapes, data_keys={"image", "text"})
    total, trainable = _counts(numpy_clip)
    assert trainable == _openai_parameter_count(512) == 100_695_905
    assert total - trainable == 53_248  # running mean and variance of every BatchNorm
    text = np.zeros((1, 77), np.int64)
    text[0, :5] = [49406, 320, 1125, 539, 49407]  # start, three words, end of text
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    out = numpy_clip.evaluate(data={"image": image, "text": text})
    assert {k: v.shape for k, v in out.items()} == {"image_features": (1, 512), "text_features": (1, 512),
                                                    "logits_per_image": (1, 1), "logits_per_text": (1, 1)}
    assert all(np.isfinite(v).all() for v in out.values())


def test_rn50_clip_has_openai_rn50_parameter_count():
    """002, "CLIP Model across Backends" (its comment names ResNet-50): OpenAI's RN50 CLIP is the
    same call with embed_dim=1024; built so, it has RN50's 102,007,137 parameters."""
    rn50 = clip(embed_dim=1024, image_resolution=224, vision_layers=(3, 4, 6, 3), vision_width=64,
                vision_patch_size=0, context_length=77, vocab_size=49408, transformer_width=512,
                transformer_heads=8, transformer_layers=12)
    pm = ml.compile(rn50, ml.NumpyBackend(), shapes={"image": [1, 3, 224, 224], "text": [1, 77]}, inference=True)
    assert _counts(pm)[1] == _openai_parameter_count(1024) == 102_007_137


@pytest.mark.parametrize("backend_name", ["torch", "jax", "mlx"])
def test_document_full_size_clip_compiles_on_each_backend(backend_name):
    """002, "CLIP Model across Backends": the guide's full-size model compiles for PyTorch, JAX and
    MLX as written; each compiled model has the guide's inputs and the four outputs at their sizes."""
    backend = _backend(backend_name)
    clip_model = clip(embed_dim=512, image_resolution=224, vision_layers=(3, 4, 6, 3), vision_width=64,
                      vision_patch_size=0, context_length=77, vocab_size=49408, transformer_width=512,
                      transformer_heads=8, transformer_layers=12)
    shapes = {"image": [1, 3, 224, 224], "text": [1, 77]}
    compiled = ml.compile(clip_model, backend, shapes=shapes, data_keys={"image", "text"})
    assert sorted(compiled.input_keys) == ["image", "text"]
    out_shapes = {v.name: tuple(int(d) for d in v.shape) for v in compiled.ir.graph.outputs}
    assert out_shapes == {"image_features": (1, 512), "text_features": (1, 512), "logits_per_image": (1, 1),
                          "logits_per_text": (1, 1)}


def test_clip_docstring_examples_run():
    """The docstrings of examples.clip (the model and the checkpoint converters) run as written."""
    for module in (clip_module, clip_weights):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_clip_image_and_text_batches_may_differ():
    """Two images against three captions: logits_per_image is [2, 3] and logits_per_text its transpose."""
    params, data, ref = _case("vit")
    assert data["image"].shape[0] != data["text"].shape[0]
    out = ml.compile(clip(**CONFIGS["vit"]), ml.NumpyBackend(), data_keys={"image", "text"}).evaluate(params, data)
    assert out["logits_per_image"].shape == (N_IMAGES, N_TEXTS)
    np.testing.assert_array_equal(out["logits_per_text"], out["logits_per_image"].T)


def test_clip_rejects_vision_layers_it_cannot_build():
    """An int vision_layers without a patch size, a non-multiple-of-64 ViT width and an
    unaligned resolution are ModelErrors saying what to pass instead."""
    with pytest.raises(ModelError, match=r"vision_patch_size > 0.*vision_layers=\(3, 4, 6, 3\)"):
        clip(vision_layers=12, vision_patch_size=0)
    with pytest.raises(ModelError, match="four stage depths.*or a layer count"):
        clip(vision_layers="RN50")
    with pytest.raises(ModelError, match="multiple of 64"):
        clip(vision_layers=2, vision_width=96, vision_patch_size=16)
    with pytest.raises(ModelError, match="divisible by 32, got 100"):
        clip(image_resolution=100)
    with pytest.raises(ml.errors.InputError, match="'extra.weight' is not a parameter"):
        clip_weights.hf_params({"extra.weight": np.zeros(2)})


def test_readme_snippet_runs(capsys):
    """examples/clip/README.md's "Running it" snippet is code users paste: it runs as written."""
    from pathlib import Path

    readme = (Path(clip_module.__file__).parent / "README.md").read_text()
    block = readme.split("## Running it", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, "examples/clip/README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("[[") and np.isfinite(float(printed.strip("[]\n"))), printed
