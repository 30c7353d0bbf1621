"""CLIP built from Mithril blocks: ``from examples.clip.model import clip`` (see README.md beside this file)."""

from .model import clip

__all__ = ["clip"]
