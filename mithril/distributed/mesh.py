"""The device mesh description (:mod:`mithril.backends.mesh`, where the backends read it)."""

from ..backends.mesh import DEFAULT_AXIS_NAMES, DeviceMesh, Spec, check_batch, check_divides, parse_mesh, split_spec, spec_str

__all__ = ["DEFAULT_AXIS_NAMES", "DeviceMesh", "Spec", "check_batch", "check_divides", "parse_mesh", "split_spec",
           "spec_str"]
