"""A validation report as one self-contained HTML page (``mithril validate --report FILE``).

The per-output table with every figure, the first divergent node per backend, and for a
per-node search a plot of each compared value's error relative to its scale (log axis) against
its place in topological order, the first divergent node marked: PNG images drawn by matplotlib
and inlined, so the page is one file to attach to an issue.
"""

from __future__ import annotations

import base64
import html
import io


# Where a relative error of exactly 0 sits on the log axis (below anything float64 resolves).
ZERO_FLOOR = 1e-18

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #17803d; font-weight: bold; } .fail { color: #c0262d; font-weight: bold; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0 1.5em; }
"""


def error_plot(report, backend: str) -> bytes:
    """A PNG: the relative error of each value the per-node search compared on ``backend``,
    against its place in topological order (log y; an exact match at the floor), values out of
    tolerance in red, the first divergent node marked."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    checks = report.node_errors[backend]
    fig = Figure(figsize=(10, 4), dpi=100)
    ax = fig.add_subplot()
    x = [c.index for c in checks]
    y = [max(c.max_rel_err, ZERO_FLOOR) if c.max_rel_err == c.max_rel_err else float("inf") for c in checks]
    top = max((v for v in y if v != float("inf")), default=1.0)
    y = [min(v, top * 10) for v in y]  # inf drawn just above the largest finite error
    ax.plot(x, y, color="#888", linewidth=0.8, zorder=1)
    ok = [(a, b) for a, b, c in zip(x, y, checks) if c.passed]
    bad = [(a, b) for a, b, c in zip(x, y, checks) if not c.passed]
    if ok:
        ax.scatter(*zip(*ok), s=10, color="#1f77b4", label="within tolerance", zorder=2)
    if bad:
        ax.scatter(*zip(*bad), s=14, color="#c0262d", label="out of tolerance", zorder=3)
    first = report.first_divergence.get(backend)
    if first is not None:
        ax.axvline(first.index, color="#c0262d", linestyle="--", linewidth=1,
                   label=f"first divergent: {first.node} ({first.op_type})")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("value, in topological order")
    ax.set_ylabel("max abs error / max |reference|")
    ax.set_title(f"{backend} against {report.reference}, per node")
    ax.grid(True, which="major", alpha=0.3)
    if ok or bad:  # below the axes: it never hides a point or the mark
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def validation_page(report) -> str:
    """The page, as text."""
    e = html.escape
    out = ["<!doctype html>", "<html><head><meta charset='utf-8'>",
           f"<title>Validation: {e(report.model)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>Validation against {e(report.reference)}</h1>",
           f"<p>Model <code>{e(report.model)}</code>; inputs: "
           + ", ".join(f"<code>{e(k)}</code> {list(v.shape)} {e(str(v.dtype))}" for k, v in report.inputs.items())
           + "</p>",
           f"<p class='{'pass' if report.passed else 'fail'}'>"
           f"{'all outputs pass' if report.passed else 'validation failed'}</p>"]
    if report.outputs:
        cols = ("backend", "output", "shape", "dtype", "max abs err", "max rel err", "max ulp", "p99 ulp",
                "mismatches", "worst element (got / ref)", "rtol", "atol", "result")
        out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
        for o in report.outputs:
            cells = [e(o.backend), e(o.name), str(list(o.shape)), e(o.dtype)]
            nums = [f"{o.max_abs_err:.4g}", f"{o.max_rel_err:.4g}", o.ulp_text(o.max_ulp), o.ulp_text(o.p99_ulp),
                    o.mismatch_text(), e(o.worst_text()), f"{o.rtol:g}", f"{o.atol:g}"]
            result = "<span class='pass'>pass</span>" if o.passed else f"<span class='fail'>FAIL</span> {e(o.note)}"
            out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells)
                       + "".join(f"<td class='num'>{c}</td>" for c in nums) + f"<td>{result}</td></tr>")
        out.append("</table>")
    for b, reason in report.errors.items():
        out.append(f"<p><b>{e(b)}</b>: <span class='fail'>FAILED</span>: {e(reason)}</p>")
    for b, reason in report.skipped.items():
        out.append(f"<p><b>{e(b)}</b>: not run: {e(reason)}</p>")
    if report.first_divergence:
        out.append("<h2>Per node</h2>")
    for b, first in report.first_divergence.items():
        out.append(f"<p><b>{e(b)}</b>: {e(first.describe()) if first else 'every node within tolerance'}</p>")
        if report.node_errors.get(b):
            png = base64.b64encode(error_plot(report, b)).decode("ascii")
            out.append(f"<img alt='relative error per node, {e(b)}' src='data:image/png;base64,{png}'>")
    out.append("</body></html>")
    return "\n".join(out)


__all__ = ["error_plot", "validation_page"]
