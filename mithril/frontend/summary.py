"""``Model.summary()``: child blocks, their terminals and inferred (symbolic) shapes, with rich."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .shapes import Namer, type_name

if TYPE_CHECKING:  # model.py imports this module for Model.summary()
    from .model import Model


def _plain(*cells) -> list[Text]:
    # Shapes like "[batch, 3]" would otherwise be read as rich markup and vanish.
    return [Text(str(c)) for c in cells]


def render_summary(model: Model, file=None) -> str:
    namer = Namer()
    table = Table(title=f"{type(model).__name__} {model.name or ''}".strip(), show_lines=True)
    for col in ("Block", "Terminal", "Shape", "Type", "Connection"):
        table.add_column(col)
    for block in model._blocks:
        rows = []
        for pname, port in model._child_ports[block].items():
            wire = model._bindings.get((block, pname))
            kind = "param" if port.param else ("in" if port.is_input else "out")
            conn = "-" if wire is None else (repr(wire.name) if wire.name else
                                             ("const" if wire.value is not None else "auto"))
            rows.append((f"{pname} ({kind})", namer.shape(port.shape), type_name(port.type.root().value), conn))
        attrs = getattr(block, "attributes", lambda: {})()
        title = f"{block.name}\n{type(block).__name__}" + "".join(f"\n{k}={v}" for k, v in attrs.items())
        for i, row in enumerate(rows):
            table.add_row(*_plain(title if i == 0 else "", *row))
    inputs, outputs = model.external()
    terms = Table(title="Terminals")
    for col in ("Name", "Kind", "Shape", "Type"):
        terms.add_column(col)
    for w in inputs:
        terms.add_row(*_plain(w.key, "param" if w.param else "input", namer.shape(w.shape), type_name(w.type.root().value)))
    for w in outputs:
        terms.add_row(*_plain(w.key, "output", namer.shape(w.shape), type_name(w.type.root().value)))
    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=False).print(table, terms)
    text = buf.getvalue()
    Console(file=file).print(table, terms) if file is not False else None
    return text
