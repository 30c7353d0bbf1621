"""A GGUF file's key-value fields as Python values (``gguf.GGUFReader`` keeps each as raw parts):
what :func:`~.gguf_io.load_gguf` and :func:`~.llama_gguf.gguf_decoder` read."""

from __future__ import annotations

from typing import Any


def field_value(field) -> Any:
    """One field's value: a str, a number, or a list of them."""
    import gguf

    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    part = field.parts[field.data[0]]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8", "replace")
    return part.tolist()[0]


def read_metadata(reader) -> dict[str, Any]:
    """Every key-value field of an open ``gguf.GGUFReader`` but the file header's (``GGUF.*``)."""
    return {k: field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
