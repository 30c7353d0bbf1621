"""Build a small Hugging Face decoder from a config, optionally train it a little, and export it to
ONNX with its key/value cache through optimum-onnx (``text-generation-with-past``): the files
``mithril export-gguf`` converts, as users make them.

optimum-onnx 0.1.0 (its only release) needs transformers < 4.58 while Mithril's environment has
transformers 5, so scripts/dev.sh installs it with its transformers, tokenizers and
huggingface_hub into a folder of its own (``.venv/optimum-onnx``) that this script puts first on
``sys.path``; run it with the environment's Python:

    python scripts/optimum_export.py --arch llama,gpt2 --out /tmp/models [--train text.txt --steps 300]

Each model lands in ``OUT/ARCH/onnx`` (model.onnx, config.json, and tokenizer.json when
``--tokenizer`` gives one). ``--config`` takes JSON overrides of the architectures' small defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

OVERLAY = Path(sys.prefix) / "optimum-onnx"

# hidden 64, 2 layers, GQA where the architecture has it
SMALL = {
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128},
    "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128},
    "qwen2": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128},
    "phi3": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "max_position_embeddings": 128, "original_max_position_embeddings": 128,
             "pad_token_id": 0},
}
CONFIGS = {"gpt2": "GPT2Config", "llama": "LlamaConfig", "qwen2": "Qwen2Config", "phi3": "Phi3Config"}


def available() -> bool:
    """Whether optimum's exporter can be imported (from the overlay, or the environment itself)."""
    import importlib.util

    return (OVERLAY / "optimum" / "exporters" / "onnx").is_dir() or importlib.util.find_spec("optimum") is not None


def _train(model, ids, steps: int, seq: int, seed: int, lr: float) -> list[float]:
    import torch

    torch.set_num_threads(1)  # a small model: threads only contend
    g = torch.Generator().manual_seed(seed)
    data = torch.tensor(ids, dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (16,), generator=g)
        batch = torch.stack([data[s:s + seq] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    model.eval()
    return losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, help=f"comma-separated: {', '.join(SMALL)}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=320)
    ap.add_argument("--config", default="{}", help="JSON overrides of the small config")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="a tokenizer.json: copied next to model.onnx (and used by --train)")
    ap.add_argument("--train", help="a text file to train on (needs --tokenizer)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    if OVERLAY.is_dir():
        sys.path.insert(0, str(OVERLAY))
    import torch
    import transformers.utils.import_utils as iu

    iu._torchvision_available = False  # a torchvision built for another torch must not break the import
    import transformers
    from optimum.exporters.onnx import main_export

    for arch in args.arch.split(","):
        if arch not in SMALL:
            ap.error(f"--arch {arch}: one of {', '.join(SMALL)}")
        torch.manual_seed(args.seed)
        cfg = getattr(transformers, CONFIGS[arch])(vocab_size=args.vocab_size,
                                                   **{**SMALL[arch], **json.loads(args.config)})
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        out = Path(args.out) / arch
        if args.train:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(args.tokenizer)
            ids = tok.encode(Path(args.train).read_text(encoding="utf-8")).ids
            losses = _train(model, ids, args.steps, args.seq, args.seed, args.lr)
            print(json.dumps({"arch": arch, "first_loss": losses[0], "last_loss": sum(losses[-10:]) / 10}),
                  flush=True)
        hf = out / "hf"
        model.save_pretrained(hf)
        main_export(str(hf), str(out / "onnx"), task="text-generation-with-past", do_validation=False)
        if args.tokenizer:
            (out / "onnx" / "tokenizer.json").write_text(Path(args.tokenizer).read_text(encoding="utf-8"),
                                                         encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
