"""Fuzz load + compile + evaluate on NumpyBackend and write docs/reliability.md, or on GGMLBackend
(``--backend ggml``: the cases draw GGML_OPS too, a worker killed by a signal is ggml aborting)
and write docs/reliability-ggml.md.

    python scripts/fuzz.py --cases 100000 --seed 1 --workers 1
    python scripts/fuzz.py --backend ggml --cases 20000 --seed 20261207 --workers 2

Cases are drawn by mithril.testing.fuzz (valid graphs, protobuf-field mutations, byte
mutations) and run in a pool of long-lived worker processes with a per-case time limit. The
report (written every --report-every seconds while running, labelled PARTIAL, and at the end)
gives the counts per outcome class, the run's date, seed and rate, every open bug signature
with an example model, and FOUND_AND_FIXED: the classes of bug the fuzzer found and the commit
that fixed each (kept by hand, below).
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mithril.testing.fuzz import BACKENDS, BUG_OUTCOMES, KINDS, OUTCOMES, FuzzStats, run_fuzz  # noqa: E402

# Every class of bug the fuzzer found, and the commit that fixed it. Add a line per fix.
FOUND_AND_FIXED = [
    ("mismatch", "LayerNormalization/RMSNormalization/GroupNormalization on float64 input computed its "
     "statistics in float32 (stash_type taken as an exact type, not a least precision)", "8654015"),
    ("exception", "an acyclic graph whose nodes are not written in topological order (onnxruntime runs "
     "it) failed at compile with a bare RuntimeError from onnx_ir's clone; load_onnx now sorts it", "528052f"),
    ("mismatch", "Reduce*/ArgMax/ArgMin with keepdims other than 0 or 1 (2, -1) kept the reduced axes; "
     "onnxruntime keeps them only for 1", "4c61694"),
    ("mismatch", "TopK with largest other than 0 or 1 returned the largest values; onnxruntime reads only 1 "
     "as largest", "c5d1c13"),
    ("mismatch", "Pad with a negative pad longer than the data (pads [5, -3] on 2 elements) cropped with a "
     "wrapped-around slice, keeping the wrong elements", "3ef7aa7"),
    ("exception", "a graph input or output declaring element type UNDEFINED (or an unknown number) loaded and "
     "then failed with a bare KeyError in np_dtype_of_onnx; now refused at load like onnxruntime", "8381a2f"),
    ("mismatch", "AveragePool on float16 summed each window in float16: windows of large values averaged "
     "to inf (onnxruntime sums in float32)", "9d23dbe"),
    ("mismatch", "LayerNormalization with a B or Scale that widens the input (B [2,0,0,1] on [6]) ran and "
     "returned an empty [2,0,0,6] tensor; now refused with the shapes", "e661c55"),
    ("exception", "nodes with the wrong number of inputs/outputs, a missing required attribute or an attribute of "
     "the wrong type (Shape with no input: IndexError in fold_constants; If with a TENSOR else_branch: "
     "ValueError in convert_attribute) failed outside the error hierarchy; now refused at load against "
     "the op's schema", "801e68e"),
    ("exception", "Split with an empty split input (or sizes not summing to the axis) returned fewer parts than "
     "outputs: bare IndexError at '_o[0]' in the generated program; now a KernelError", "c7b9439"),
    ("exception", "names, op types or domains that are not valid UTF-8 came back from protobuf as bytes and "
     "failed as TypeErrors (onnx.defs.get_schema, UnsupportedDomainError's message); now refused at load",
     "d331d0f"),
    ("mismatch", "Squeeze-13 with an empty axes tensor removed no dims; onnxruntime removes every dim of 1",
     "22be494"),
    ("exception", "Split-18 without its num_outputs attribute got num_outputs=None from the lowering (the "
     "attribute's default shadows the node's output count), so split = [2] on two outputs returned one part: "
     "bare IndexError at '_o[1]'; the kernel now takes the count from its NodeInfo", "7d62794"),
    ("hang", "an Einsum equation with a '-' that does not start '->' ('j-.i', a byte mutation of 'ij->i') made "
     "onnx's Einsum shape inference (run by compile, and by onnxruntime) loop forever; now refused at load",
     "56de720"),
    ("hostile input", "compile's constant folding computed a node before checking its size: ConstantOfShape "
     "[20000, 20000] allocated 1.6 GB to discard it, [100000, 100000] asked for 40 GB (found by a hand-made "
     "hostile case, not the fuzzer)", "ef4678e"),
    ("hostile input", "structural checks before deserializing: opsets, one definition per value, undefined "
     "reads, cycles, recursive functions, tensor data vs dims, size limit, external data confined and "
     "bounded", "3e3d7d5"),
    ("mismatch", "ArgMax/ArgMin of a rank-0 input returned [0]; onnxruntime returns the scalar 0 (seed "
     "20261124)", "1eb1058"),
    ("mismatch", "ArgMax/ArgMin picked the first NaN; onnxruntime's strict scan picks a NaN only as the first "
     "element (seed 20261124)", "fc1f862"),
    ("mismatch", "the float16 AveragePool fix reached only the shared kernel: the torch and MLX overrides "
     "still summed float16 windows in float16 (found by the regression test written for the fuzzer's case)",
     "1eb1058"),
    ("exception", "a kernel returning fewer outputs than its node failed at '_o[1]' outside any node's site; "
     "now a KernelError naming the node and both counts", "73fbe12"),
    ("harness", "a MemoryError in the worker's own float64 comparison of a 2^24-element output counted as a "
     "Mithril exception (seed 20261124); now 'outputs too large to compare'", "fc1f862"),
]

# The GGML target's finds (--backend ggml): what aborted the process (GGML_ASSERT) or ran wrong.
GGML_FOUND_AND_FIXED = [
    ("crash", "Gemm with alpha != 1 over a weight whose columns are not a multiple of 4 (stored padded, read "
     "back as a view): ggml_scale asserts a contiguous input while computing (SIGABRT)", "126d2db"),
    ("exception", "GatherElements on 1-D data: the rule's base offsets summed nothing into an int, not an "
     "array (AttributeError), refused the node", "126d2db"),
    ("exception", "a NumPy kernel failing on a node GGML leaves to NumPy (a mutated model) raised its bare "
     "exception; now a KernelError naming the node, as on NumpyBackend", "126d2db"),
    ("crash", "a grouped Conv with many groups (FastViT-T8) ran the per-node budget's ggml context out of "
     "memory, SIGABRT; RegNetX-002 outgrew the planned graph (issue 57's models, not the fuzzer)", "126d2db"),
    ("crash", "an RNN/GRU/LSTM of about 300 steps held every step alive: ggml-alloc ran out of free blocks, "
     "SIGABRT (found reading ggml-alloc.c, not by the fuzzer)", "126d2db"),
]

OUTCOME_MEANING = {
    "ok": "loaded, compiled and ran (and matched onnxruntime where it also ran the model)",
    "refused": "a MithrilError: the expected refusal of a broken model",
    "exception": "BUG: an exception outside the MithrilError hierarchy, or one the public-API boundary "
                 "wrapped (CompileError/PassError/EvaluationError with a non-Mithril cause)",
    "hang": "BUG: no answer within the per-case time limit (worker killed and replaced)",
    "crash": "BUG: the worker process died (worker replaced)",
    "mismatch": "BUG: Mithril and onnxruntime both ran it and an output differs beyond ml.validate's tolerance",
}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(stats: FuzzStats, args, partial: bool, commit: str) -> str:
    started = dt.datetime.fromtimestamp(stats.started, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ggml = getattr(args, "backend", "numpy") == "ggml"
    lines = ["# Reliability: fuzzing load, compile and evaluate" + (" on GGMLBackend" if ggml else ""), ""]
    if ggml:
        lines += ["Every case runs on `ml.GGMLBackend(num_threads=1)` (NumPy for the nodes ggml does not take) in "
                  "a worker process: ggml answers a call it cannot do with GGML_ASSERT, which aborts the process, "
                  "so an abort is a `crash`. The valid graphs also draw the GGML ops of "
                  "`mithril.testing.fuzz.GGML_OPS` (Convs past or up to their padded input, grouped with "
                  "channel multipliers; pools; RNN, GRU and LSTM; ArgMax indices gathering a table of another "
                  "length; TopK over NaN and inf; negative norm epsilons). Issue 57, Must 1.", ""]
    if partial:
        lines += [f"**PARTIAL REPORT**: {stats.cases} of {args.cases} cases run so far; the run is still "
                  f"going (or was stopped). Counts below cover the cases run.", ""]
    lines += [
        f"Generated by `python scripts/fuzz.py {'--backend ggml ' if ggml else ''}--cases {args.cases} "
        f"--seed {args.seed} --workers {args.workers}` (`mithril/testing/fuzz.py`) at commit `{commit}`.",
        "",
        "| | |", "|---|---|",
        f"| started | {started} |",
        f"| seed | {stats.seed} |",
        f"| cases | {stats.cases} |",
        f"| workers | {stats.workers} |",
        f"| per-case time limit | {args.time_limit:g} s |",
        f"| elapsed | {stats.elapsed:.0f} s |",
        f"| cases/second | {stats.rate:.1f} |",
        f"| worker restarts | {stats.restarts} |",
        "",
        "## Outcomes", "",
        "| outcome | cases | " + " | ".join(KINDS) + " | meaning |",
        "|---|---:|" + "---:|" * len(KINDS) + "---|",
    ]
    for o in OUTCOMES:
        per_kind = " | ".join(str(stats.by_kind.get(k, {}).get(o, 0)) for k in KINDS)
        lines.append(f"| {o} | {stats.outcomes[o]} | {per_kind} | {OUTCOME_MEANING[o]} |")
    lines += [
        "",
        f"Kinds: `valid` (random op chains from the table in mithril/testing/fuzz.py, valid attributes and "
        f"shapes), `field` (protobuf-field mutations of valid models: attributes, dims, dtypes, constant "
        f"values, dropped or renamed inputs, swapped ops, deleted or duplicated nodes, opsets), `bytes` "
        f"(bit flips, overwritten, inserted, deleted, duplicated bytes, truncation).",
        "",
        f"Compared with onnxruntime: {stats.compared} cases (both ran the model); onnxruntime refused "
        f"{stats.reference_refused} models Mithril ran, crashed on {stats.reference_crash} and hung on "
        f"{stats.reference_hang} (counted as `ok` for Mithril, not as Mithril bugs). Not compared: "
        + (", ".join(f"{v} with {k}" for k, v in stats.not_compared.items()) or "none") + ".",
        "",
    ]
    if stats.refusals:
        lines += ["Refusals by error class: " + ", ".join(f"{k} {v}" for k, v in stats.refusals.most_common()) + ".", ""]
    if stats.refused_reference_ran:
        total = sum(stats.refused_reference_ran.values())
        lines += [f"Refused models that onnxruntime ran ({total}; most are mutated models onnxruntime is lenient "
                  f"about, the rest gaps to look at), by error and op: "
                  + ", ".join(f"{k} {v}" for k, v in stats.refused_reference_ran.most_common(25)) + ".", ""]
    if ggml:
        total = sum(stats.backstops.values())
        lines += [f"Nodes the backstop moved to NumPy (mithril/backends/ggml/guard.py: a ggml call or tensor a "
                  f"rule's check let through that ggml would abort on): {total} case(s)"
                  + (", by op and ggml function: " + "; ".join(f"{k} x{v}" for k, v in stats.backstops.most_common(30))
                     if total else "") + ". `result shape` (and a reshape or view of another size): the rule built "
                  "another shape than the plan's, which takes shapes the file declares (value_info, outputs) where "
                  "they do not contradict its own inference: a mutated file declaring shapes its nodes do not make. "
                  "`Gather: ggml_get_rows`: "
                  "indices computed in the graph (ArgMax over an axis longer than the table) that could reach "
                  "past the table, refused by design (ggml checks rows only while computing).", ""]
    lines += ["## Open bugs found by this run", ""]
    bugs = sorted(stats.bugs.values(), key=lambda b: -b.count)
    if not bugs:
        lines += ["None: 0 " + ", 0 ".join(BUG_OUTCOMES) + ".", ""]
    else:
        lines += ["| outcome | signature | cases | first seen in | example | message |", "|---|---|---:|---|---|---|"]
        for b in bugs:
            msg = b.message.replace("|", "\\|").replace("\n", " ")[:200]
            lines.append(f"| {b.outcome} | `{b.signature}` | {b.count} | {b.kind} | `{b.example}` | {msg} |")
        lines.append("")
    lines += ["## Bug classes found by the fuzzer and fixed", "", "| class | bug | fixed in |", "|---|---|---|"]
    for outcome, what, commit_ in GGML_FOUND_AND_FIXED if ggml else FOUND_AND_FIXED:
        lines.append(f"| {outcome} | {what} | `{commit_}` |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--backend", choices=BACKENDS, default="numpy")
    ap.add_argument("--report", default=None, help="default: docs/reliability.md, docs/reliability-ggml.md for ggml")
    ap.add_argument("--report-every", type=float, default=300.0, help="seconds between partial reports")
    ap.add_argument("--failures", default=None, help="folder for example models of each bug (default /tmp)")
    args = ap.parse_args(argv)
    commit = _commit()
    default = "reliability-ggml.md" if args.backend == "ggml" else "reliability.md"
    report = Path(args.report or ROOT / "docs" / default)
    last_write = [time.time()]

    def progress(stats: FuzzStats):
        counts = ", ".join(f"{o} {stats.outcomes[o]}" for o in OUTCOMES)
        print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {stats.cases}/{args.cases} cases, "
              f"{stats.rate:.1f}/s: {counts}", flush=True)
        if time.time() - last_write[0] >= args.report_every and stats.cases < args.cases:
            last_write[0] = time.time()
            report.write_text(render(stats, args, partial=True, commit=commit))

    stats = run_fuzz(args.cases, seed=args.seed, workers=args.workers, time_limit=args.time_limit,
                     failure_dir=args.failures, progress=progress, progress_every=30.0, backend=args.backend)
    report.write_text(render(stats, args, partial=stats.cases < args.cases, commit=commit))
    print(f"wrote {report}")
    for b in stats.bugs.values():
        print(f"{b.outcome}: {b.signature} x{b.count} e.g. {b.example}: {b.message[:300]}")
    return 1 if stats.bug_count() else 0


if __name__ == "__main__":
    raise SystemExit(main())
