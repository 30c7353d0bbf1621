#!/usr/bin/env python
"""The ONNX node suite on ggml-python's own ONNX runtime (``ggml.contrib.onnx``), without its
NumPy fallback: the peer that GGMLBackend's strict count is compared with.

    python scripts/ggml_contrib_conformance.py                      # fallback_policy="strict"
    python scripts/ggml_contrib_conformance.py --policy native -k '^test_conv'

Each case is ``GgmlRuntimeBackend.prepare(model, fallback_policy=POLICY)`` then ``rep.run(inputs)``
per data set, compared with the expected outputs at the case's own rtol/atol by the same
comparison as ``mithril conformance``. ``strict`` allows ggml ops, decompositions into ggml ops
and constant folding; ``native`` only the first two. A case passes when every output matches;
an error, a refusal, a NumPy fallback island run, or a crash (ggml aborts the process on a failed
assertion: cases run in a child process that is restarted after one) does not pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np


def _child(policy: str) -> None:
    """Runs the case names read from stdin, one line each, printing ``START`` and ``DONE`` lines."""
    from ggml.contrib.onnx import GgmlRuntimeBackend

    from mithril.conformance import compare_outputs, decode_value, node_cases

    cases = node_cases()
    for line in sys.stdin:
        name = line.strip()
        print(f"START {name}", flush=True)
        tc = cases[name]
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                rep = GgmlRuntimeBackend.prepare(tc.model, fallback_policy=policy)
                for inputs, expected in tc.data_sets:
                    got = rep.run([decode_value(v) for v in inputs])
                    if getattr(rep, "last_numpy_fallback_island_executions", ()):
                        raise RuntimeError("ran a NumPy fallback island")
                    outs = [o.name for o in tc.model.graph.output]
                    for oname, exp, g in zip(outs, expected, got):
                        compare_outputs(oname, decode_value(exp), g, tc.rtol, tc.atol)
            status, reason = "pass", ""
        except Exception as exc:  # every failure is recorded with its reason
            status, reason = "fail", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        print("DONE " + json.dumps({"name": name, "status": status, "reason": reason}), flush=True)


def run(policy: str, names: list[str], log=None) -> dict[str, dict]:
    """name -> {status, reason} for every case, restarting the child after a crash."""
    results: dict[str, dict] = {}
    todo = list(names)
    while todo:
        proc = subprocess.Popen([sys.executable, __file__, "--child", "--policy", policy],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdin.write("".join(n + "\n" for n in todo))
        proc.stdin.close()
        current = None
        for line in proc.stdout:
            if line.startswith("START "):
                current = line[6:].strip()
            elif line.startswith("DONE "):
                r = json.loads(line[5:])
                results[r["name"]] = {"status": r["status"], "reason": r["reason"]}
                current = None
                if log and len(results) % 100 == 0:
                    print(f"{len(results)}/{len(names)} cases, "
                          f"{sum(v['status'] == 'pass' for v in results.values())} passed", file=log, flush=True)
        rc = proc.wait()
        if current is not None:
            results[current] = {"status": "crash", "reason": f"the process died (exit status {rc})"}
        todo = [n for n in todo if n not in results]
        if current is None and todo:  # died between cases: record the next one to make progress
            results[todo.pop(0)] = {"status": "crash", "reason": f"the process died (exit status {rc})"}
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="strict", choices=("strict", "native", "compat"))
    p.add_argument("-k", dest="filter", default=None, help="only the node cases matching this regex")
    p.add_argument("--output", default=None, help="write per-case results as JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.policy)
        return 0
    from mithril.conformance import case_names

    names = case_names(args.filter, include_models=False)
    results = run(args.policy, names, log=sys.stderr)
    counts = Counter(r["status"] for r in results.values())
    if args.verbose:
        for n in names:
            print(f"{results[n]['status'].upper():6s} {n}  {results[n]['reason']}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    print(f"ggml.contrib.onnx (fallback_policy={args.policy!r}): {counts['pass']} / {len(names)} node cases pass "
          f"({counts['fail']} fail or refused, {counts['crash']} crash)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
