"""A GPT-2 language model built from Mithril blocks: ``from examples.gpt.model import create_gpt``."""

from .model import create_gpt

__all__ = ["create_gpt"]
