"""Plan passes: rewrites of a lowering plan (:class:`~mithril.backends.plan.Plan`) on one
contract, run by one manager.

A pass (:class:`PlanPass`) rewrites a plan through its use-def index
(:class:`~mithril.backends.plan.PlanIndex`) and says whether it changed anything;
:class:`PassManager` runs a backend's list of them on one copy of the plan. Each fusion pattern
is matched here once and used by every backend that wants it, each making the fused node its
own way:

- :mod:`.gelu`: Gelu written out as elementwise ops (Torch: the Gelu kernel; GGML: its Gelu rule);
- :mod:`.conv`: Conv (+ Add of a residual) (+ Relu/Clip) (C: the Conv kernel's epilogue; Torch:
  one oneDNN call);
- :mod:`.inplace`: activations written into their input's fresh array (NumPy, Torch).
"""

from __future__ import annotations

from .base import PassManager, PassResult, PlanPass, run_passes
from .conv import ConvChain, FuseConvChains
from .gelu import FuseGelu, GeluMatch, gelu_kernel_pass, match_gelu
from .inplace import FRESH_RESULTS, InPlaceActivations, in_place_activations
from .match import mithril_kernel

__all__ = ["FRESH_RESULTS", "ConvChain", "FuseConvChains", "FuseGelu", "GeluMatch", "InPlaceActivations",
           "PassManager", "PassResult", "PlanPass", "gelu_kernel_pass", "in_place_activations", "match_gelu",
           "mithril_kernel", "run_passes"]
