"""Device meshes: one program over many devices, through the engines users already run.

``JaxBackend(device_mesh=(2, 2))`` builds a ``jax.sharding.Mesh``; ``ml.compile(..., parallel=...)``
chooses a strategy (data, fsdp, tensor), which becomes a per-parameter placement
(:class:`ShardingPlan`), and JAX's compiler partitions the program from it. See
docs/distributed.md.
"""

from .mesh import DEFAULT_AXIS_NAMES, DeviceMesh, parse_mesh, split_spec
from .sharding import STRATEGIES, ShardingPlan, parse_parallel, plan_sharding

__all__ = ["DEFAULT_AXIS_NAMES", "STRATEGIES", "DeviceMesh", "ShardingPlan", "parse_mesh", "parse_parallel",
           "plan_sharding", "split_spec"]
