"""The segmented-backend layer C and GGML are clients of (onnxruntime's execution-provider model):

- :mod:`.rules`: the opset-aware rule table a client's rules live in;
- :mod:`.capability`: for every node, whether it runs natively, and why not;
- :mod:`.partition`: native segments and fallback nodes, and each segment's inputs and outputs;
- :mod:`.policy`: fixed shapes, the ``fallback`` option, the one warning or the refusal;
- :mod:`.backend`: :class:`SegmentedBackend`, whose ``lower`` runs these and hands the steps to
  the client's ``compile_segments``;
- :mod:`.program`: :class:`SegmentedProgram`, the run loop with its profiling hook.

A client's segment is then render + build + run, nothing else.
"""

from .backend import Partition, SegmentedBackend
from .capability import capability, why_not
from .partition import Segment, later_reads, partition, segment_io
from .program import SegmentedProgram
from .rules import NativeRule, RuleTable

__all__ = ["NativeRule", "Partition", "RuleTable", "Segment", "SegmentedBackend", "SegmentedProgram", "capability",
           "later_reads", "partition", "segment_io", "why_not"]
