"""Device meshes' numbers for docs/performance.md: ``scripts/bench.py --mesh``.

One training step (forward, gradients, SGD with momentum) of the zoo's GPT under each strategy on
1, 2 and 4 JAX host devices: the median step time and the parameter plus optimizer-state bytes
the fullest device holds (read from the arrays' shards). The measurements run in a child process
started with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (JAX fixes its device count
when it starts); the parent renders the section. The one-device plain row and the
"data, 1-device mesh" row take turns step by step, so their ratio (the mesh path's overhead) is
not the load drift between two runs.

    python scripts/bench_mesh.py --child --json rows.json     # what bench.py --mesh runs
    python scripts/bench_mesh.py --overhead-only --steps 3    # the two one-device rows, quickly
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT = dict(bias=True, block_size=64, dims=256, num_heads=4, num_layers=4, vocab_size=1024)
BATCH, SEQ = 16, 64
# (strategy, devices, device_mesh, parallel)
# "data, 1-device mesh": compile(parallel="data") on JaxBackend(device_mesh=(1,)), the mesh path's
# overhead on one device (issue 20: within 10 % of the plain path).
CASES = [("one device", 1, None, None), ("data, 1-device mesh", 1, (1,), "data")]
for _n in (2, 4):
    CASES += [("data", _n, (_n,), "data"), ("fsdp", _n, (_n,), "fsdp"), ("tensor", _n, (_n,), "tensor"),
              ("pipeline", _n, (_n,), {"pipeline": "data", "microbatches": 4})]


def _trainer(backend, parallel):
    import mithril as ml
    import models_zoo
    from mithril.models import CrossEntropy, Mean, Model, TrainModel, Transpose

    model = Model()
    model |= models_zoo.create_gpt(**GPT)(input="input", output="logits")
    model += Transpose(axes=(0, 2, 1))(output="output")
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    kwargs = {} if parallel is None else {"parallel": parallel}
    return ml.compile(tm, backend, shapes={"input": [BATCH, SEQ], "target": [BATCH, SEQ]},
                      data_keys={"input", "target"}, **kwargs)


# The first two cases take turns step by step (see _child).
INTERLEAVED = ("one device", "data, 1-device mesh")


class _Run:
    """One case: its compiled trainer, parameters and optimizer state, stepped one step at a time."""

    def __init__(self, case, data):
        import warnings

        import mithril as ml
        from mithril.errors import ReplicatedOpsWarning
        from mithril.optimizers import SGD

        self.strategy, self.n, self.mesh, parallel = case
        self.backend = ml.JaxBackend(device_mesh=self.mesh) if self.mesh else ml.JaxBackend()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReplicatedOpsWarning)
            self.pm = _trainer(self.backend, parallel)
        self.backend.set_seed(0)
        self.params = self.pm.place(self.pm.randomize_params())
        self.opt = SGD(0.01, momentum=0.9)
        self.state = self.opt.init(self.params)
        self.data, self.times, self.outputs = data, [], None

    def step(self, timed: bool) -> None:
        import jax

        pm = self.pm
        t0 = time.perf_counter()
        self.outputs, grads = pm.evaluate(self.params, self.data)
        self.params, self.state = self.opt.update(
            self.params, {k: g for k, g in grads.items() if k in pm.trainable_keys}, self.state)
        jax.block_until_ready((self.params, self.outputs))
        if timed:
            self.times.append(time.perf_counter() - t0)

    def row(self) -> dict:
        import numpy as np

        backend, times = self.backend, self.times
        held = backend.per_device_bytes(list(self.params.values()) + list(self.state["trace"].values())) \
            if self.n > 1 else {0: sum(np.asarray(v).nbytes for v in self.params.values()) * 2}
        row = {"strategy": self.strategy, "devices": self.n, "mesh": str(backend.mesh) if self.mesh else "-",
               "median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
               "max_ms": max(times) * 1e3, "bytes_per_device": max(held.values()),
               "loss": float(backend.to_numpy(self.outputs[self.pm.loss_key])), "steps": len(times),
               "interleaved": self.strategy in INTERLEAVED}
        print(f"{self.strategy:<11} {self.n} devices: {row['median_ms']:.1f} ms/step, "
              f"{row['bytes_per_device'] / 2**20:.2f} MiB per device", flush=True)
        return row


def _child(steps: int, warmup: int, overhead_only: bool = False) -> list[dict]:
    import numpy as np

    import mithril as ml

    ml.JaxBackend(device_mesh=(4,))  # before any other JAX work: four host devices
    rng = np.random.default_rng(0)
    ids = rng.integers(0, GPT["vocab_size"], (BATCH, SEQ))
    data = {"input": ids, "target": (ids + 1) % GPT["vocab_size"]}
    # The mesh path's overhead on one device is a few per cent at most, less than the drift of this
    # shared machine's load between two runs one after the other: the plain and the one-device-mesh
    # program take turns step by step, the same number of steps, each pair in alternating order.
    pair = [_Run(case, data) for case in CASES if case[0] in INTERLEAVED]
    for i in range(warmup + steps):
        for run in (pair if i % 2 == 0 else pair[::-1]):
            run.step(timed=i >= warmup)
    rows = [run.row() for run in pair]
    del pair
    if overhead_only:
        return rows
    for case in CASES:
        if case[0] in INTERLEAVED:
            continue
        run = _Run(case, data)
        for i in range(warmup + steps):
            run.step(timed=i >= warmup)
        rows.append(run.row())
    return rows


def measure(steps: int = 10, warmup: int = 3, overhead_only: bool = False) -> list[dict]:
    """Run the child and return its rows (only the two one-device rows with ``overhead_only``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                                           " --xla_force_host_platform_device_count=4").strip(),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, str(Path(__file__)), "--child", "--json", str(out), "--steps", str(steps),
                        "--warmup", str(warmup)] + (["--overhead-only"] if overhead_only else []),
                       check=True, env=env, timeout=1800)
        return json.loads(out.read_text())


def render(rows: list[dict], started: str, load: str, cores: int) -> str:
    base = next(r for r in rows if r["strategy"] == "one device")
    mesh1 = next((r for r in rows if r["strategy"] == "data, 1-device mesh"), None)
    lines = [
        "## Device meshes",
        "",
        f"Generated by `scripts/bench.py --mesh` ({started}; load average {load} at the start; {cores} cores).",
        "",
        f"One training step (forward, gradients, SGD with momentum) of the zoo's GPT ({GPT['num_layers']} layers, "
        f"{GPT['dims']} wide, {GPT['vocab_size']}-word vocabulary; batch {BATCH} x {SEQ} tokens) on JAX host "
        "devices (`XLA_FLAGS=--xla_force_host_platform_device_count=4`), median of the timed steps. Memory is "
        "the parameters plus the optimizer state (SGD's momentum) held by the fullest device, read from the "
        "arrays' shards. **Host devices share this machine's cores**: every device's work runs on the same "
        f"{cores} cores, so no device count can go past their speed-up (one device's program already spreads "
        "its large ops over them, less its small ones: data and fsdp beat it here by keeping both cores busy); the "
        "rows measure what partitioning costs (collectives, smaller matmuls, pipeline bubbles) and what it saves "
        "in memory per device. \"data, 1-device mesh\" is what a script written for N devices runs with N = 1 "
        "(`JaxBackend(device_mesh=(1,))`, `compile(parallel=\"data\")`, parameters through `pm.place`): the "
        "plain program, the options checked and nothing split. It and the \"one device\" row take turns step by "
        f"step ({mesh1['steps']} timed steps each, alternating which goes first), so a change in the machine's load "
        f"falls on both: against the plain path, its median step is {mesh1['median_ms'] / base['median_ms'] - 1:+.1%} "
        f"and its fastest step {mesh1['min_ms'] / base['min_ms'] - 1:+.1%} (the bar for the mesh path on one "
        "device: within 10 %)."
        if mesh1 else "in memory per device.",
        "",
        "Every number here is from host devices on this machine's CPU; no GPU run is recorded.",
        "",
        "| strategy | devices | mesh | step ms (min / median / max) | vs one device | params + state per device | vs one device |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['devices']} | {r['mesh']} | {r['min_ms']:.1f} / {r['median_ms']:.1f} / "
                     f"{r['max_ms']:.1f} | {r['median_ms'] / base['median_ms']:.2f}x | "
                     f"{r['bytes_per_device'] / 2**20:.2f} MiB | {r['bytes_per_device'] / base['bytes_per_device']:.2f}x |")
    lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help="measure (in a process with 4 host devices)")
    ap.add_argument("--json", help="where the child writes its rows")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--overhead-only", action="store_true",
                    help="only the one-device plain and 1-device-mesh rows (the mesh path's overhead), for a quick check")
    args = ap.parse_args(argv)
    if args.child:
        rows = _child(args.steps, args.warmup, args.overhead_only)
        if args.json:
            Path(args.json).write_text(json.dumps(rows))
        return 0
    rows = measure(args.steps, args.warmup, args.overhead_only)
    print(render(rows, time.strftime("%Y-%m-%d %H:%M %Z"), "-", os.cpu_count() or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
