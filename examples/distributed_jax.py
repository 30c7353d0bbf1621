"""Train the zoo's GPT on a JAX device mesh with each parallel strategy, and check it against one device.

    python examples/distributed_jax.py --steps 10    # every strategy on 4 host devices (--strategy picks one)

No GPU needed: on the CPU, ``JaxBackend(device_mesh=...)`` made before any other JAX work has JAX
create host devices for it (at least 8, so later meshes in the process fit;
XLA_FLAGS=--xla_force_host_platform_device_count=N sets the count yourself).
Each strategy starts from the same parameters and sees the same batches as the one-device run;
the script prints both loss curves' largest difference, the parameters' largest difference at
the end, and the parameter bytes one device holds.
"""

from __future__ import annotations

import argparse

import numpy as np

import mithril as ml
import models_zoo
from mithril.models import CrossEntropy, Mean, Model, TrainModel, Transpose
from mithril.optimizers import SGD, fit

STRATEGIES = {  # name -> (device_mesh, parallel)
    "data": ((4,), "data"),
    "fsdp": ((4,), "fsdp"),
    "tensor": ((4,), "tensor"),
    "data+tensor": ((2, 2), {"data": "data", "tensor": "model"}),
    "pipeline": ((4,), {"pipeline": "data", "microbatches": 4}),
}


def gpt_trainer(backend, **parallel):
    """The zoo's GPT with a next-token cross entropy (logits [N, T, V] -> [N, V, T]: classes on axis 1)."""
    model = Model()
    model |= models_zoo.create_gpt(bias=True, block_size=16, dims=64, num_heads=4, num_layers=2,
                                   vocab_size=128)(input="input", output="logits")
    model += Transpose(axes=(0, 2, 1))(output="output")
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    return ml.compile(tm, backend, shapes={"input": [8, 16], "target": [8, 16]}, data_keys={"input", "target"},
                      **parallel)


def train(pm, params, batches):
    params, _, losses = fit(pm, params, lambda epoch: batches, SGD(0.1, momentum=0.9), 1, progress=False)
    return params, np.array(losses)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), action="append",
                        help="a strategy to run (repeatable; default: all)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    args = parser.parse_args(argv)
    names = args.strategy or list(STRATEGIES)
    # The first backend made decides how many host devices JAX creates: the largest mesh, first.
    meshes = {name: ml.JaxBackend(device_mesh=STRATEGIES[name][0]) for name in names}
    single = ml.JaxBackend()

    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 128, (8, 16)) for _ in range(args.steps)]
    batches = [{"input": x, "target": (x + 1) % 128} for x in ids]  # learnable: each id's successor
    reference = gpt_trainer(single)
    single.set_seed(0)
    init = {k: np.asarray(v) for k, v in reference.randomize_params().items()}
    want_params, want = train(reference, {k: single.array(v) for k, v in init.items()}, batches)
    print(f"one device: loss {want[0]:.4f} -> {want[-1]:.4f} over {args.steps} steps, "
          f"{sum(v.nbytes for v in init.values()) / 2**10:.0f} KiB of parameters")
    for name in names:
        backend = meshes[name]
        pm = gpt_trainer(backend, parallel=STRATEGIES[name][1])
        params = pm.place(init)
        got_params, got = train(pm, params, batches)
        per_device = max(backend.per_device_bytes(got_params).values())
        diff = max(float(np.abs(np.asarray(got_params[k]) - np.asarray(v)).max()) for k, v in want_params.items())
        print(f"{name:<12} mesh {backend.mesh}: loss curve differs by {np.abs(got - want).max():.1e}, parameters by "
              f"{diff:.1e}; {per_device / 2**10:.0f} KiB of parameters per device")


if __name__ == "__main__":
    main()
