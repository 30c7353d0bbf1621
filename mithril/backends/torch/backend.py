"""The PyTorch backend: the generated program over a NumPy-compatible facade of torch tensors."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import types
import warnings

import numpy as np

from ...errors import (BackendOptionError, BackendUnavailableError, DeviceFallbackWarning, JitTraceError, MeshError,
                       MithrilError)
from ..backend import Backend
from ..host_memory import process_memory_info
from ..options import warn_user
from ..mesh import parse_mesh

# Imported by the first TorchBackend(), so `import mithril` never imports torch; _tmesh (this
# folder's mesh.py, torch.distributed.tensor) by the first one with a device mesh.
torch = txp = _tgraph = _tmesh = _tpipe = None


def _import_torch() -> None:
    global torch, txp, _tgraph
    if torch is None:
        try:
            import torch as _torch
        except ImportError as exc:
            raise BackendUnavailableError("TorchBackend needs torch: pip install mithril[torch]") from exc
        from . import graph as _graph
        from . import xp as _txp

        torch, txp, _tgraph = _torch, _txp, _graph


def _process_group_size() -> int:
    """The processes of the torch.distributed group this process is in (initialized, or about
    to be from torchrun's ``RANK``/``WORLD_SIZE``); 1 outside one."""
    if not torch.distributed.is_available():
        return 1
    if torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return 1


def _present_devices() -> list[str]:
    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def _find_device(device):
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` (or a torch.device) -> the torch.device, or
    None when it is not present; a name torch does not know is an error."""
    present = _present_devices()
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendOptionError(
            f"TorchBackend: {device!r} is not a device; devices are named cpu, cuda, cuda:<index>, mps "
            f"(present here: {', '.join(present)})") from exc
    if dev.type == "cuda" and dev.index is None and len(present) > 1 and present[1].startswith("cuda"):
        dev = torch.device("cuda:0")
    name = dev.type if dev.index is None else f"{dev.type}:{dev.index}"
    return dev if name in present else None


def _parse_device(device) -> "torch.device":
    """The torch.device for ``device``; an absent one warns once and gives the CPU."""
    dev = _find_device(device)
    if dev is None:
        warn_user(f"TorchBackend: device {str(device)!r} is not present (present devices: "
                  f"{', '.join(_present_devices())}); running on cpu", DeviceFallbackWarning)
        dev = torch.device("cpu")
    return dev


PARALLEL_STRATEGIES = {
    "data_parallel": "split each batch (dim 0 of every data input) over `devices`, concatenate the outputs (in a "
                     "torch.distributed process group: device_mesh=(world size,), one device per process)",
    "model_parallel": "split the model over `devices`: in a torch.distributed process group, device_mesh=(world "
                      "size,) with its axis named 'model', compiled tensor parallel by default (or "
                      "parallel='pipeline'); outside one, the program on the first of `devices`",
}

# torch.compile's keyword arguments, as compile(..., jit_options=...) takes them.
_TORCH_COMPILE_OPTIONS = {
    "backend": "torch.compile's backend: 'inductor' (default), 'aot_eager', 'eager', ...",
    "mode": "'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'",
    "fullgraph": "refuse graph breaks",
    "dynamic": "trace shapes symbolically (default False: one program per input shape)",
    "options": "a dict of backend options",
    "disable": "run the forward uncompiled",
}


class TorchBackend(Backend):
    """Runs lowered ONNX graphs with PyTorch, eagerly by default.

    Users see ``torch.Tensor`` everywhere: ``evaluate`` takes tensors (or NumPy arrays, kept at
    their dtype) and returns tensors, gradients are tensors, and the tensor API (``array``,
    ``zeros``, ``add``...) takes and returns tensors. Inside, the shared kernels run through
    :mod:`mithril.backends.torch.xp`, a NumPy-compatible facade (``TorchArray``, whose
    ``.native`` is the tensor): ``prepare_inputs`` wraps, ``finalize_outputs`` unwraps. Hot ops
    (Conv, Gemm, MatMul, pools, normalizations, Softmax...) call ``torch.nn.functional``
    directly (``mithril/backends/torch/overrides.py``). Every evaluation runs under ``torch.no_grad()``;
    gradients (``evaluate(..., output_gradients=...)``) use ``torch.autograd.grad``.

    On the CPU, forward-only calls run 2-D float32/bfloat16 convolutions channels_last (NHWC
    strides, the same values): oneDNN's NHWC kernels are faster (ResNet-18 1.27x, MobileNetV2's
    depthwise convs 3x), and each weight is copied to NHWC once while it lives unchanged. A
    float32 weight is instead reordered once into oneDNN's blocked layout, whatever its kernel,
    and run by oneDNN's own convolution (what torch.compile's freezing calls; ResNet-18's 3x3
    layers 1.2-1.25x faster, MobileNetV2 1.1-1.3x), which also applies a following Relu, Clip,
    Add, or Add-then-Relu to each output tile (``torch/fusion.py``). 4-D outputs come back
    row-major. Gradient calls keep NCHW, whose backward was faster.

    With ``onednn_graph`` (the default), a convolutional model's forward-only float32 calls on
    the CPU run as one graph that oneDNN's graph API compiles into fused partitions: the second
    call with the same input shapes, dtypes and strides and the same parameter tensors (unchanged
    in place) traces the program (``torch.jit.trace``), freezes the parameters into it, and keeps
    it when its outputs agree with the traced call's; later such calls run it
    (:mod:`mithril.backends.torch.graph`: which ops, what is refused). MobileNetV2 ~1.6x -> ~1.15x
    onnxruntime's time, ResNet-18 ~1.1x -> ~1.0x; ~40 MiB more resident memory (TorchScript and
    oneDNN's compiled partitions). ``onednn_graph=False`` keeps every call op by op.

    ``compile=True`` wraps the generated forward in ``torch.compile`` (inductor). Measured on
    this 2-core CPU, interleaved with PyTorch eager, it is not faster: ResNet-18 (batch 1,
    224x224) 0.93x of eager's time both with and without it, the small BERT (sequence 128)
    1.57x with it and 0.99x without; and its first call takes 9-70 s. So eager is the default.

    ``enable_amp=True`` runs the forward under ``torch.autocast`` (float16 on CUDA and MPS,
    bfloat16 on the CPU): matmuls and convolutions compute in the lower precision, and floating
    outputs are cast back to the dtypes the graph declares, so users get what they declared.
    ``cudnn_benchmark`` turns on torch's cuDNN autotuner (process-wide). ``parallel_strategy``
    with ``devices``: "data_parallel" splits each batch over the devices (one program per
    device, see :class:`_DataParallel`), "model_parallel" runs on ``devices[0]`` and says so (outside
    a process group).
    An absent device warns once and runs on the CPU; so does each absent entry of ``devices``.
    Inside a ``torch.distributed`` process group (torchrun, ``mithril launch``) "data_parallel"
    is ``device_mesh=(world size,)`` (compile's default ``parallel="data"``: DTensors, gradients
    all-reduced), each process on its ``LOCAL_RANK``'s entry of ``devices`` (this host's devices,
    one per process); "model_parallel" is the same mesh with its axis named ``"model"``, where
    compile's default is ``parallel="tensor"`` (Megatron: each weight split, activations
    all-reduced; :attr:`default_parallel`); ``"pipeline"`` works too, and ``"data"``, which would
    copy every parameter onto every process, is refused (:meth:`check_sharding`).

    ``device_mesh=(N,)`` or ``(a, b)`` (axis names ``axis_names``, by default ``("data",)`` and
    ``("data", "model")``) runs over a ``torch.distributed`` process group of that many
    processes, one per device (torchrun, ``mithril launch --nproc N script.py``, or
    :func:`mithril.distributed.launch.spawn`): the backend joins the group from torchrun's
    environment (gloo on the CPU, NCCL on CUDA, each process on the GPU of its ``LOCAL_RANK``)
    and builds a ``DeviceMesh`` with named axes. Arrays split over it are DTensors
    (``ones(..., tensor_split=(0,))``, :meth:`shard`), and ``ml.compile(..., parallel="data" |
    "fsdp" | "tensor")`` places parameters and data by its plan (:meth:`place`). The program
    runs on DTensors, which split each op and insert the collectives; an op DTensor can't split
    runs on whole tensors (one ``ReplicatedOpsWarning`` listing them). ``evaluate`` returns
    DTensors, as JAX returns sharded arrays: each acts as the whole tensor, a batch output stays
    split over the batch, and :meth:`to_numpy` gives the whole array (``full_tensor()``, a
    collective: every process calls it). Gradients have their parameter's placements (a
    data-parallel gradient all-reduced, an FSDP one reduce-scattered), so the optimizers update
    DTensors unchanged. ``parallel="pipeline"`` (or ``{"pipeline": axis, "microbatches": n}``) on
    a 1-D mesh runs one stage per process (:mod:`mithril.backends.torch.pipeline`): each holds its
    stage's parameters (the others are ``meta`` tensors), every process gets the outputs, and
    :meth:`gather` gives the parameters whole.

    uint16/uint32/uint64 are reported unsupported (torch has no arithmetic kernels for them);
    strings stay NumPy object arrays and the string kernels run on the host.

    >>> import mithril as ml
    >>> b = ml.TorchBackend(dtype=ml.float32, device="cpu")
    >>> b.add(b.ones(2), b.ones(2))
    tensor([2., 2.])
    """

    name = "torch"
    supports_gradients = True
    jit_option_names = _TORCH_COMPILE_OPTIONS

    def __init__(self, dtype=None, device=None, compile: bool = False, *, jit: bool | None = None,
                 enable_amp: bool = False, cudnn_benchmark: bool = False, parallel_strategy: str | None = None,
                 devices: list | None = None, device_mesh=None, axis_names=None, onednn_graph: bool = True,
                 **unknown):
        from ... import dtypes

        _import_torch()
        self._refuse_unknown_options(unknown)
        from . import overrides as _registers_overrides  # noqa: F401

        if jit is not None and compile and not jit:
            raise BackendOptionError("TorchBackend: compile=True asks for torch.compile and jit=False refuses it; "
                                     "give one of them")
        self.mesh = parse_mesh("TorchBackend", device_mesh, axis_names)
        self.device_mesh = None if self.mesh is None else self.mesh.shape
        if self.mesh is not None and parallel_strategy is not None:
            raise BackendOptionError("TorchBackend: device_mesh= and parallel_strategy= are two ways to use several "
                                     "devices; give one (device_mesh=(N,) with compile(..., parallel='data') is "
                                     "data parallel over N processes)")
        self._devices = self._parallel_devices(device, parallel_strategy, devices)
        self.parallel_strategy = parallel_strategy
        own_device = False  # True: this process's device comes from devices=, not from LOCAL_RANK
        world = _process_group_size() if parallel_strategy in ("data_parallel", "model_parallel") else 1
        if world > 1:
            # Inside a process group (torchrun, mithril launch): the design's data_parallel is
            # device_mesh=(world,) with compile's default parallel="data", on this process's device;
            # model_parallel the same mesh, its axis named "model" (compile defaults to parallel="tensor" there).
            self._devices, own_device = [self._rank_device(devices)], True
            self.mesh = parse_mesh("TorchBackend", (world,), ("model",) if parallel_strategy == "model_parallel"
                                   else axis_names)
            self.device_mesh = self.mesh.shape
            if parallel_strategy == "model_parallel":
                self.default_parallel = "tensor"
        self._device = self._devices[0] if self._devices else _parse_device("cpu" if device is None else device)
        # The torch.distributed DeviceMesh; None on one device (a one-device mesh is the plain path).
        self._torch_mesh = None
        if self.mesh is not None and self.mesh.size > 1:
            self._torch_mesh = self._build_mesh(own_device)
        self.xp = txp
        self.jit_by_default = bool(compile or jit)
        self.compile = self.jit_by_default
        self.enable_amp = bool(enable_amp)
        # Autocast's lower precision: float16 on CUDA and MPS (tensor cores), bfloat16 on the CPU.
        self.amp_dtype = torch.bfloat16 if self._device.type == "cpu" else torch.float16
        self.cudnn_benchmark = bool(cudnn_benchmark)
        self.onednn_graph = bool(onednn_graph)
        if cudnn_benchmark:
            if torch.cuda.is_available():
                torch.backends.cudnn.benchmark = True  # process-wide: torch has one setting
            else:
                warn_user("TorchBackend: cudnn_benchmark=True tunes cuDNN's convolutions, and CUDA is not "
                          "available here; ignored")
        super().__init__(dtype if dtype is not None else dtypes.float32, str(self._device))

    def _rank_device(self, devices) -> "torch.device":
        """This process's entry of ``devices`` (this host's devices, one per process: its
        ``LOCAL_RANK``'s); with ``devices`` left out, the device of :meth:`_build_mesh`."""
        local = int(os.environ.get("LOCAL_RANK", torch.distributed.get_rank() if torch.distributed.is_initialized()
                                   else 0))
        if devices is None:
            return self._devices[0]
        if local >= len(self._devices):
            raise BackendOptionError(f"TorchBackend: parallel_strategy={self.parallel_strategy!r} in a process "
                                     f"group runs one process per device, and this process (LOCAL_RANK={local}) "
                                     f"has no entry in devices={list(devices)!r}: list one device per process of "
                                     f"this host")
        return self._devices[local]

    def _build_mesh(self, own_device: bool = False):
        """The process group's DeviceMesh; on CUDA each process takes the GPU of its LOCAL_RANK
        (or, with ``own_device``, the one already chosen)."""
        global _tmesh
        if _tmesh is None:
            from . import mesh as _mesh_module

            _tmesh = _mesh_module
        if self._device.type == "cuda":
            if not own_device or self._device.index is None:
                self._device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self._device)
        elif self._device.type != "cpu":
            raise MeshError(f"TorchBackend: device_mesh runs on cpu (gloo) or cuda (NCCL), not {self._device}")
        return _tmesh.build_mesh(self._device.type, self.mesh)

    # -- device meshes -------------------------------------------------------------------
    def shard(self, value, spec):
        """``value`` (NumPy or a tensor, the whole array) split over the backend's mesh by
        ``spec`` (the mesh axis of each dim, None for whole): a DTensor (``distribute_tensor``
        with ``Shard(d)`` or ``Replicate()`` per mesh dim). Rank 0's ``value`` is the one
        scattered; where each process holds only its own part, use :meth:`from_local`."""
        self._need_mesh("shard")
        return _tmesh.shard(self._torch_mesh, self.mesh, _native(value, self._device).to(self._device), tuple(spec))

    def from_local(self, part, spec):
        """This process's ``part`` of an array split by ``spec`` (each process passes its own:
        the batch rows its data loader read) as the DTensor of the whole array
        (``DTensor.from_local``; parts are equal in shape, in rank order along each split dim)."""
        self._need_mesh("from_local")
        return _tmesh.from_local(self._torch_mesh, self.mesh, _native(part, self._device).to(self._device),
                                 tuple(spec))

    @property
    def torch_mesh(self):
        """The ``torch.distributed.device_mesh.DeviceMesh`` (None on one device), for torch code
        that works with the same DTensors."""
        return self._torch_mesh

    def _need_mesh(self, what: str) -> None:
        if self._torch_mesh is None:
            raise MeshError(f"TorchBackend: {what} needs a backend with a device_mesh of several devices "
                            f"(this one has device_mesh={self.device_mesh})")

    def place(self, values: dict, plan) -> dict:
        """Parameters or data placed by a :class:`~mithril.distributed.ShardingPlan`: NumPy
        arrays and plain tensors (whole arrays: rank 0's is the one scattered, as :meth:`shard`)
        as DTensors by the plan's spec; DTensors (:meth:`from_local` for a process's own rows)
        keep their placement; strings stay NumPy. Facades (the program's inputs) stay facades.
        On a pipeline each process keeps its stage's parameters (plain tensors) and holds the
        others as ``meta`` tensors (shape and dtype, no storage); data stays whole (every
        process passes the same batch)."""
        if plan.pipeline is not None:
            return self._place_stages(values, plan)
        out = {}
        for name, v in values.items():
            t = v.native if isinstance(v, txp.TorchArray) else v
            if isinstance(t, torch.Tensor):
                keep = _tmesh.is_dtensor(t)
            else:  # strings and sequences stay as they are
                keep = not isinstance(t, (np.ndarray, np.generic)) or np.asarray(t).dtype == object
            if keep:
                out[name] = v
                continue
            placed = self.shard(t, plan.spec(name) if name in plan.specs else ())
            out[name] = txp.TorchArray(placed) if isinstance(v, txp.TorchArray) else placed
        return out

    def _place_stages(self, values: dict, plan) -> dict:
        rank = torch.distributed.get_rank()
        out = {}
        for name, v in values.items():
            t = v.native if isinstance(v, txp.TorchArray) else v
            if name in plan.stages and plan.stages[name] != rank:
                held = _tpipe.placeholder(t)
            elif isinstance(t, torch.Tensor) and _tmesh.is_dtensor(t):
                held = t.full_tensor()
            elif isinstance(t, torch.Tensor) or (isinstance(t, (np.ndarray, np.generic)) and t.dtype != object):
                held = _native(t, self._device).to(self._device)
            else:
                out[name] = v
                continue
            out[name] = txp.TorchArray(held) if isinstance(v, txp.TorchArray) else held
        return out

    def gather(self, values: dict, plan) -> dict:
        """``values`` (parameters placed by ``plan``, a :class:`~mithril.distributed.ShardingPlan`:
        ``pm.sharding``) as whole tensors on every process: a pipeline stage's parameters
        broadcast from the process holding them, DTensors' ``full_tensor()``. A collective:
        every process calls it (to save a checkpoint, or compare with one process)."""
        self._need_mesh("gather")
        if plan is not None and plan.pipeline is not None:
            native = {k: v.native if isinstance(v, txp.TorchArray) else v for k, v in values.items()}
            return _tpipe.gather(native, plan.stages, torch.distributed.get_rank(), self._device)
        return {k: v.full_tensor() if _tmesh.is_dtensor(v) else v for k, v in values.items()}

    def check_sharding(self, plan) -> None:
        """A pipeline runs one stage per process: its axis must be the whole mesh. model_parallel
        splits the model (compile's default there is parallel='tensor'): data parallel is refused."""
        if self.parallel_strategy == "model_parallel" and "data" in plan.strategies:
            raise MeshError(f"TorchBackend(parallel_strategy='model_parallel') splits the model over the process "
                            f"group's {self.mesh.size} processes: compile(..., parallel='tensor') (each weight "
                            f"split, the default here) or parallel='pipeline' (a stage per process); data parallel "
                            f"would copy every parameter onto every process")
        if plan.pipeline is None:
            return
        stages = len(plan.pipeline.segments)
        if self.mesh.size != stages:
            raise MeshError(f"TorchBackend: a pipeline of {stages} stages runs one stage per process, and "
                            f"device_mesh={self.mesh.shape} has {self.mesh.size} processes; give the pipeline a "
                            f"mesh of its own: TorchBackend(device_mesh=({stages},))")
        if self.enable_amp:
            raise MeshError("TorchBackend: enable_amp=True is not implemented for pipeline stages")

    def lower_stages(self, plan, stages, *, file_path: str | None = None):
        """The program with its pipeline stages (:mod:`mithril.backends.torch.pipeline`): every
        process runs it, each computing its own stage; values cross between stages point to
        point, and the outputs are broadcast to every process."""
        global _tpipe
        if _tpipe is None:
            from . import pipeline as _pipeline_module

            _tpipe = _pipeline_module
        self._need_mesh("a pipeline")
        program = super().lower_stages(plan, stages, file_path=file_path)
        return program.with_forward(_tpipe.pipeline_forward(program.forward, plan, stages, self._device))

    def pipeline_stage(self, index: int, fn, *args):
        """Stage ``index`` of a pipeline's program: computed on process ``index`` (it receives
        what earlier stages made, and sends what later ones read); placeholders elsewhere."""
        return _tpipe.stage(index, fn, args)

    def vjp_parts(self, program, parts, diff_params, diff_data) -> list:
        """A pipeline's micro-batches (GPipe: every forward pass, then the backward passes,
        :meth:`mithril.backends.torch.pipeline.PipelineForward.vjp_parts`); else one after the other."""
        if _tpipe is not None and isinstance(program.forward, _tpipe.PipelineForward):
            return program.forward.vjp_parts(parts, diff_params, diff_data)
        return super().vjp_parts(program, parts, diff_params, diff_data)

    def per_device_bytes(self, arrays) -> dict:
        """``{rank: bytes}`` that ``arrays`` (a dict or a list) hold on each process of the mesh
        (a DTensor's local shard, a tensor's whole; ``{0: bytes}`` on one device). On a mesh
        the counts are gathered from every process: every process calls it."""
        values = arrays.values() if isinstance(arrays, dict) else arrays
        values = [v.native if isinstance(v, txp.TorchArray) else v for v in values]
        if self._torch_mesh is None:
            return {0: sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))}
        counts = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(counts, _tmesh.local_bytes(values))
        return dict(enumerate(counts))

    def _parallel_devices(self, device, strategy, devices) -> list:
        """``devices`` as torch.devices (absent ones warned about once, and replaced by the CPU),
        checked against ``parallel_strategy``; [] without a strategy."""
        if strategy is None:
            if devices is not None:
                raise BackendOptionError(f"TorchBackend: devices={devices!r} needs a parallel_strategy, one of "
                                         f"{', '.join(PARALLEL_STRATEGIES)}")
            return []
        if strategy not in PARALLEL_STRATEGIES:
            raise BackendOptionError(
                f"TorchBackend: unknown parallel_strategy {strategy!r}; valid strategies: "
                + "; ".join(f"{k} ({v})" for k, v in PARALLEL_STRATEGIES.items()))
        if devices is None:
            devices = ["cpu" if device is None else device]
        if isinstance(devices, str) or not devices:
            raise BackendOptionError(f"TorchBackend: devices must be a non-empty list such as ['cuda:0', 'cuda:1'], "
                                     f"got {devices!r}")
        found = [_find_device(d) for d in devices]
        absent = [str(d) for d, f in zip(devices, found) if f is None]
        if absent:
            warn_user(f"TorchBackend: device{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent))} "
                      f"not present (present devices: {', '.join(_present_devices())}); "
                      f"{'they run' if len(absent) > 1 else 'it runs'} on cpu", DeviceFallbackWarning)
        found = [f if f is not None else torch.device("cpu") for f in found]
        if device is not None and _find_device(device) not in (found[0], None):
            raise BackendOptionError(f"TorchBackend: device={device!r} differs from devices[0]={devices[0]!r}; "
                                     "with a parallel_strategy the first of devices is the main device")
        if strategy == "model_parallel" and len(found) > 1 and _process_group_size() == 1:
            warn_user(f"TorchBackend: model_parallel runs the whole program on {found[0]} outside a process group: "
                      f"it splits a model over one process per device (mithril launch --nproc {len(found)} "
                      f"script.py, torchrun)")
        return found

    @classmethod
    def devices(cls) -> list[str]:
        """``"cpu"``, then ``"cuda:<i>"`` per CUDA device and ``"mps"`` where present."""
        _import_torch()
        return _present_devices()

    def synchronize(self, value) -> None:
        if self._device.type == "cuda":  # CUDA kernels return before the GPU has run them
            torch.cuda.synchronize(self._device)

    def set_num_threads(self, n: int) -> bool:
        torch.set_num_threads(n)  # process-wide, as torch's own
        return True

    def scope(self):
        """No autograd recording (vjp turns it back on) and this backend's device."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        stack.enter_context(txp.on_device(self._device))
        return stack

    # -- dtypes and conversion -------------------------------------------------------
    def unsupported_dtype_reason(self, dtype) -> str | None:
        dtype = np.dtype(dtype)
        if dtype == object:
            return None  # strings: the string kernels run on the host with NumPy
        if dtype in txp.STORAGE_ONLY:
            return f"torch stores {dtype} but has no arithmetic kernels for it (add, max, ... are not implemented)"
        if dtype not in txp.TO_TORCH:
            return f"torch has no {dtype} dtype"
        return None

    def from_numpy(self, arr):
        """A ``torch.Tensor`` on this backend's device holding a copy of ``arr`` (its exact dtype);
        NumPy string arrays stay NumPy (the string kernels run on the host)."""
        if isinstance(arr, txp.TorchArray):
            arr = arr.native
        if isinstance(arr, torch.Tensor):
            return arr.to(self._device)
        arr = np.asarray(arr)
        if arr.dtype == object:
            return arr
        return txp.tensor_from_numpy(np.array(arr), self._device)

    def hold(self, arr):
        """The model's own parameter for ``evaluate(None, ...)``: on the CPU a tensor over
        ``arr``'s memory (``torch.from_numpy``; the programs never write into parameters), so
        the weights are not held twice; elsewhere, or for dtypes torch reads through a view, a
        copy (:meth:`from_numpy`)."""
        arr = np.asarray(arr)
        if (self._device.type != "cpu" or arr.dtype == object or not arr.flags.c_contiguous
                or arr.dtype.type.__module__ == "ml_dtypes" or arr.dtype in txp.STORAGE_ONLY
                or arr.dtype not in txp.TO_TORCH):
            return self.from_numpy(arr)
        with warnings.catch_warnings():  # read-only memory: shared, as no program writes into it
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(arr)

    def to_numpy(self, arr) -> np.ndarray:
        if isinstance(arr, txp.TorchArray):
            arr = arr.native
        if isinstance(arr, torch.Tensor) and arr.is_meta:
            raise MeshError(f"TorchBackend: a meta tensor {tuple(arr.shape)} {arr.dtype} holds no values: on a "
                            "pipeline it stands for a parameter another process's stage holds; "
                            "backend.gather(params, pm.sharding) gives every parameter whole on every process")
        if isinstance(arr, torch.Tensor):
            return txp.tensor_to_numpy(arr)
        return np.asarray(arr)

    def to_torch(self, arr):
        """The ``torch.Tensor`` behind a backend array."""
        return arr.native if isinstance(arr, txp.TorchArray) else torch.as_tensor(arr)

    def dtype_of(self, value) -> np.dtype | None:
        if isinstance(value, torch.Tensor):
            return txp.TO_NUMPY.get(value.dtype)
        return super().dtype_of(value)

    def prepare_inputs(self, values: dict) -> dict:
        # The program computes on the facade; NumPy arrays keep their dtype (no casting) and are
        # copied, so an output that aliases an input (Identity, Reshape) never aliases the caller's array.
        return {k: self._to_facade(v) for k, v in values.items()}

    def constant(self, value: np.ndarray):
        # Converted (and moved to the device) once at compile instead of by every op that reads it.
        return value if value.dtype == object else txp.TorchArray(self.from_numpy(value))

    def _to_facade(self, v):
        if isinstance(v, txp.TorchArray):
            return v
        if isinstance(v, torch.Tensor):  # meta: a parameter another pipeline stage holds (no data to move)
            return txp.TorchArray(v if v.is_meta or v.device == self._device else v.to(self._device))
        if isinstance(v, (list, tuple)):  # a sequence input
            return [self._to_facade(x) for x in v]
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype != object:
            return txp.TorchArray(self.from_numpy(v))
        return v

    def finalize_outputs(self, outputs: dict) -> dict:
        # Users get torch.Tensors: facades are unwrapped, values kernels computed on the host
        # (NumPy) become tensors; strings stay NumPy object arrays.
        return {k: self._to_native(v) for k, v in outputs.items()}

    def _to_native(self, v):
        if isinstance(v, (list, tuple)):
            return [self._to_native(x) for x in v]
        if isinstance(v, txp.TorchArray):
            return _row_major(v.native)
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype != object:
            return self.from_numpy(v)
        return v

    # -- compilation hooks -----------------------------------------------------------
    def plan_passes(self):
        from ..passes import InPlaceActivations, gelu_kernel_pass
        from .fusion import FuseConvActivations
        from .inplace import SWAPS

        return [gelu_kernel_pass(_gelu_kernel()), FuseConvActivations(), InPlaceActivations(SWAPS)]

    def lower(self, plan, **kwargs):
        """The generated program, run under ``torch.autocast`` with ``enable_amp`` (outputs cast
        back to the dtypes the graph declares), and over ``devices`` with data_parallel (one
        program per device, its constants on that device)."""
        program = super().lower(plan, **kwargs)
        forward = program.forward
        if self._runs_onednn_graphs() and _tgraph.eligible(plan):
            from .fusion import CallMemo

            forward = _tgraph.OneDnnGraph(forward, [v for v in program.namespace.values() if isinstance(v, CallMemo)])
        if self.parallel_strategy == "data_parallel" and len(set(self._devices)) > 1:
            per_device = {}
            main = self._device
            try:
                for dev in dict.fromkeys(self._devices):
                    self._device = dev
                    per_device[dev] = program.forward if dev == main else super().lower(plan, **kwargs).forward
            finally:
                self._device = main
            forward = _DataParallel([per_device[d] for d in self._devices], self._devices, main, _batched_outputs(plan))
        elif self.parallel_strategy == "data_parallel" and len(self._devices) > 1:
            forward = _DataParallel([forward] * len(self._devices), self._devices, self._device, _batched_outputs(plan))
        if self._torch_mesh is not None:
            forward = _tmesh.OnMesh(forward)
        if self.enable_amp:
            declared = {v.name: txp.TO_TORCH.get(v.dtype) for v in plan.outputs if v.dtype is not None}
            # A float16/bfloat16 backend's graph already computes in its dtype (backends/precision.py):
            # autocast lowers to that dtype too, so float16 and bfloat16 never meet in one op.
            half = self.dtype.name in ("float16", "bfloat16")
            forward = _Autocast(forward, self._device.type, txp.TO_TORCH[self.dtype.numpy] if half else self.amp_dtype,
                                declared)
        return program if forward is program.forward else program.with_forward(forward)

    def _runs_onednn_graphs(self) -> bool:
        """Whether forward-only calls may run as oneDNN graphs (:mod:`.graph`): ``onednn_graph``,
        float32 on the CPU, on one device, without autocast, where torch has TorchScript's bridge."""
        return self.onednn_graph and _tgraph.AVAILABLE and self._device.type == "cpu" and \
            self.dtype.name == "float32" and self._torch_mesh is None and not self.enable_amp and \
            self.parallel_strategy is None

    def jit(self, forward, options: dict | None = None):
        """``torch.compile`` of the whole forward; ``options`` are torch.compile's keyword
        arguments (``backend``, ``mode``, ``fullgraph``, ``dynamic``, ``options``, ``disable``).
        On a device mesh the program runs eagerly (one warning): its DTensor ops go through a
        torch function mode that torch.compile is not asked to trace."""
        options = self.check_jit_options(options)
        if isinstance(forward, _tgraph.OneDnnGraph):  # torch.compile traces the program itself
            forward = forward.forward
        if self._torch_mesh is not None:
            warn_user("TorchBackend: on a device mesh the program runs eagerly over DTensors (torch.compile is not "
                      "used)")
            return forward
        return _Compiled(forward, options)

    # -- devices, memory -----------------------------------------------------------------
    def to_device(self, x, device):
        """``x`` (a tensor, or what :meth:`array` takes) on ``device``; an absent device warns
        and ``x`` stays where it is."""
        dev = _find_device(device)
        x = x if isinstance(x, torch.Tensor) else self.from_numpy(self.to_numpy(x))
        if dev is None:
            warn_user(f"TorchBackend: device {str(device)!r} is not present (present devices: "
                      f"{', '.join(_present_devices())}); the tensor stays on {x.device}", DeviceFallbackWarning)
            return x
        return x.to(dev)

    def get_memory_info(self) -> dict:
        """CUDA's allocator statistics on a CUDA device, MPS's on Apple's GPU (MB); the
        process's resident memory on the CPU."""
        mb = 2**20
        if self._device.type == "cuda":
            return {"used": torch.cuda.memory_allocated(self._device) / mb,
                    "peak": torch.cuda.max_memory_allocated(self._device) / mb,
                    "reserved": torch.cuda.memory_reserved(self._device) / mb,
                    "total": torch.cuda.get_device_properties(self._device).total_memory / mb,
                    "source": f"torch.cuda allocator of {self._device}"}
        if self._device.type == "mps":
            used = torch.mps.current_allocated_memory() / mb
            return {"used": used, "peak": max(used, torch.mps.driver_allocated_memory() / mb),
                    "source": "torch.mps allocator"}
        return process_memory_info()

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        if _tpipe is not None and isinstance(program.forward, _tpipe.PipelineForward):  # one micro-batch
            return program.forward.vjp_parts([(params, data, output_gradients)], diff_params, diff_data)[0]
        if self._torch_mesh is not None:
            # An op of the backward pass without a DTensor sharding rule gets a replicated one, and
            # the pass runs again (every process meets the same op, so all of them do).
            return _tmesh.replicating_missing_ops(
                lambda: self._vjp(program, params, data, diff_params, diff_data, output_gradients))
        return self._vjp(program, params, data, diff_params, diff_data, output_gradients)

    def _vjp(self, program, params, data, diff_params, diff_data, output_gradients, eager=False):
        forward = program.forward if eager else program.jitted or program.forward  # torch.compile's differentiates too
        given = params, data
        params, data = dict(params), dict(data)
        leaves = {}
        with torch.enable_grad():
            for src, names in ((params, diff_params), (data, diff_data)):
                for k in names:
                    leaf = _native(src[k], self._device).detach().requires_grad_(True)
                    leaves[k] = leaf
                    src[k] = txp.TorchArray(leaf)
            outputs = forward(params, data)
            roots, cots = [], []
            for name, g in output_gradients.items():
                out = outputs.get(name)
                t = out.native if isinstance(out, txp.TorchArray) else None
                if t is None or not t.requires_grad or g is None:
                    continue
                roots.append(t)
                # Placed as data inputs are (prepare_inputs): a CPU tensor or a NumPy array moves to the
                # device. evaluate checked its dtype and shape: no cast, no broadcast.
                g = _native(self._to_facade(g), self._device)
                if self._torch_mesh is not None:  # a cotangent placed as its output is
                    g = _tmesh.like_output(g, t)
                cots.append(g)
            if roots:
                try:
                    grads = torch.autograd.grad(roots, list(leaves.values()), cots, allow_unused=True)
                except Exception as exc:
                    # Autograd's engine runs no line of the program: the forward call of the op whose
                    # backward failed, found by running both again, names the node (runner.node_error).
                    # Not on a mesh, where a pass run again by one process would wait on the others.
                    if self._torch_mesh is None and not torch.is_anomaly_enabled():
                        exc.forward_frames = _forward_frames_of_failure(lambda: self._vjp(
                            program, *given, diff_params, diff_data, output_gradients, eager=True))
                    raise
            else:
                grads = [None] * len(leaves)
        out = {k: _row_major(v.native.detach()) if isinstance(v, txp.TorchArray) else v for k, v in outputs.items()}
        grads = {k: _row_major(g) if g is not None else torch.zeros_like(leaf).detach()
                 for (k, leaf), g in zip(leaves.items(), grads)}
        if self._torch_mesh is not None:  # each gradient placed as its parameter: all-reduced or reduce-scattered
            grads = {k: _tmesh.like(g, leaves[k]) for k, g in grads.items()}
        return out, grads

    def checkpoint(self, fn, *args):
        """``torch.utils.checkpoint`` (non-reentrant) of a segment of the generated forward
        while autograd records (vjp): its saved tensors are dropped and recomputed in the backward
        pass. Under ``no_grad`` (forward-only calls) a plain call."""
        if not torch.is_grad_enabled():
            return fn(*args)
        from torch.utils.checkpoint import checkpoint

        if self._torch_mesh is not None:  # the recomputation meets DTensors too
            fn = _tmesh.under_mesh_mode(fn)
        return checkpoint(fn, *args, use_reentrant=False)

    # -- tensor API: natives in and out; NumPy semantics through the facade -------------
    def relu(self, x):
        return torch.relu(_native(x, self._device))

    def sigmoid(self, x):
        return torch.sigmoid(_native(x, self._device))


def _native_api(name):
    """The base tensor API method ``name`` over torch.Tensors (NumPy semantics, through the facade)."""
    base = getattr(Backend, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        return _unwrap(base(self, *_wrap(args), **kwargs))

    return method


def _wrap(v):
    if isinstance(v, torch.Tensor):
        return txp.TorchArray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x) for x in v)
    return v


def _unwrap(v):
    return v.native if isinstance(v, txp.TorchArray) else v


for _name in ("add", "subtract", "multiply", "divide", "matmul", "maximum", "minimum", "tanh", "isnan", "sum",
              "mean", "max", "reshape", "transpose", "concat",
              "power", "negative", "abs", "exp", "log", "sqrt", "sin", "cos", "where", "min"):
    setattr(TorchBackend, _name, _native_api(_name))


def _row_major(t):
    """``t`` contiguous where the Conv kernel's channels_last layout (overrides.py) reached it:
    users get the row-major tensors a NumPy-like program gives (``view``, ``numpy()`` strides);
    other tensors as they are."""
    if type(t) is torch.Tensor and t.dim() == 4 and not t.is_contiguous() and \
            t.is_contiguous(memory_format=torch.channels_last):
        return t.contiguous()
    return t


def _native(v, device):
    if isinstance(v, txp.TorchArray):
        return v.native
    if isinstance(v, torch.Tensor):
        return v
    return txp.tensor_from_numpy(np.asarray(v), device)


class _Autocast:
    """The forward under ``torch.autocast``: matmuls and convolutions run in ``dtype``; floating
    outputs come back in the dtype the graph declares (users get the dtypes they declared)."""

    def __init__(self, forward, device_type: str, dtype, declared: dict):
        self.forward, self.device_type, self.dtype, self.declared = forward, device_type, dtype, declared

    def __call__(self, params, data):
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.forward(params, data)
        return {k: self._declared(v, self.declared.get(k)) for k, v in out.items()}

    @staticmethod
    def _declared(v, dtype):
        if isinstance(v, txp.TorchArray) and dtype is not None and v.native.is_floating_point() and v.native.dtype != dtype:
            return txp.TorchArray(v.native.to(dtype))
        return v


def _batched_outputs(plan) -> dict:
    """Per output: True when it is per-row (its dim 0 is the data inputs' batch dim), False when
    it is not (a scalar loss, running statistics), None when the plan cannot tell. Warns once
    when compile's ``shapes`` fixed the batch dim, which the program may then hold as a constant."""
    batch_dims = {v.shape[0] for v in plan.inputs if v.shape}
    fixed = {v.name: v.shape[0] for v in plan.inputs if v.shape and isinstance(v.shape[0], int)}
    if fixed:
        warn_user(f"TorchBackend: data_parallel runs parts of the batch, and compile's shapes fix the batch dim "
                  f"({', '.join(f'{k}: {n}' for k, n in fixed.items())}): shapes computed from it may be constants "
                  "of the program; leave dim 0 symbolic (e.g. 'N') for data_parallel")
    batched = {}
    for v in plan.outputs:
        if v.shape is None or (v.shape and v.shape[0] is None):
            batched[v.name] = None
        else:
            batched[v.name] = bool(v.shape) and v.shape[0] in batch_dims
    return batched


class _DataParallel:
    """data_parallel: each batch (dim 0 of every data input) split over the devices, each part
    run by that device's program. Per-row outputs are concatenated on the main device; outputs
    that are not per-row (a mean loss, running statistics) are averaged over the parts, weighted
    by their rows, as DDP averages gradients: a mean over the batch comes out exact, a sum as
    the mean of the parts' sums. Batch statistics (BatchNorm in training) are per part."""

    def __init__(self, forwards: list, devices: list, main, batched: dict | None = None):
        self.forwards, self.devices, self.main = forwards, devices, main
        self.batched = batched or {}

    def __call__(self, params, data):
        sizes = {}
        for k, v in data.items():
            if not isinstance(v, txp.TorchArray) or v.native.ndim == 0:
                raise MithrilError(f"data_parallel splits every data input along dim 0; input {k!r} is "
                                   f"{'a scalar' if isinstance(v, txp.TorchArray) else type(v).__name__}")
            sizes[k] = v.native.shape[0]
        if len(set(sizes.values())) > 1:
            raise MithrilError(f"data_parallel splits every data input along dim 0 (the batch), and they differ: {sizes}")
        batch = next(iter(sizes.values()), 0)
        if batch == 0:  # no data inputs, or an empty batch: nothing to split
            return self.forwards[0](params, data)
        bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(batch), len(self.devices))])
        parts = []
        for forward, dev, start, stop in zip(self.forwards, self.devices, bounds[:-1], bounds[1:]):
            if stop == start:
                continue
            p = {k: txp.TorchArray(v.native.to(dev)) if isinstance(v, txp.TorchArray) else v for k, v in params.items()}
            d = {k: txp.TorchArray(v.native[start:stop].to(dev)) for k, v in data.items()}
            with txp.on_device(dev):
                parts.append((int(stop - start), forward(p, d)))
        if len(parts) == 1:
            return parts[0][1]
        return {name: self._combine(name, [(rows, result[name]) for rows, result in parts], batch)
                for name in parts[0][1]}

    def _combine(self, name, parts, batch):
        if not all(isinstance(v, txp.TorchArray) for _, v in parts):
            raise MithrilError(f"data_parallel combines array outputs; output {name!r} is "
                               f"{type(next(v for _, v in parts if not isinstance(v, txp.TorchArray))).__name__}")
        tensors = [(rows, v.native.to(self.main)) for rows, v in parts]
        per_row = all(t.ndim > 0 and t.shape[0] == rows for rows, t in tensors)
        batched = self.batched.get(name)
        if batched is None:
            batched = per_row
        if batched:
            if not per_row:
                raise MithrilError(f"data_parallel: output {name!r} should have one row per input row, but the parts "
                                   f"gave shapes {[list(t.shape) for _, t in tensors]} for {[r for r, _ in tensors]} rows")
            return txp.TorchArray(torch.cat([t for _, t in tensors], dim=0))
        if len({tuple(t.shape) for _, t in tensors}) > 1:
            raise MithrilError(f"data_parallel: output {name!r} is not per-row and its parts differ in shape: "
                               f"{[list(t.shape) for _, t in tensors]}")
        if not tensors[0][1].is_floating_point():
            if any(not torch.equal(t, tensors[0][1]) for _, t in tensors[1:]):
                raise MithrilError(f"data_parallel: output {name!r} (not per-row, {tensors[0][1].dtype}) differs "
                                   "between the parts and cannot be averaged")
            return txp.TorchArray(tensors[0][1])
        return txp.TorchArray(sum(t * (rows / batch) for rows, t in tensors))


class _Compiled:
    """``torch.compile`` over a native-tensor version of the generated forward."""

    def __init__(self, forward, options: dict | None = None):
        self.forward = forward
        self.options = dict(options or {})  # the user's jit_options, as torch.compile got them

        def native_forward(params, data):
            wrap = {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
            wrap_d = {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
            out = forward(wrap, wrap_d)
            return {k: v.native if isinstance(v, txp.TorchArray) else v for k, v in out.items()}

        self._compiled = torch.compile(_own_code(native_forward), **{"dynamic": False, **(options or {})})

    def __call__(self, params, data):
        unwrap = lambda d: {k: v.native if isinstance(v, txp.TorchArray) else v for k, v in d.items()}  # noqa: E731
        # Kernels read static inputs (shapes, axes) with NumPy on the host; dynamo's NumPy tracing
        # would turn those reads into tensors (and asserts on np.nditer), so they stay Python.
        with torch._dynamo.config.patch(**_DYNAMO_CONFIG), warnings.catch_warnings():
            # The kernels' lru_cache'd helpers are pure functions of static ints: tracing through
            # the cache, as dynamo warns it does, computes the same.
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            try:
                out = self._compiled(unwrap(params), unwrap(data))
            except Exception as exc:
                if _compile_failure(exc):
                    raise _trace_error(exc) from exc
                raise
        return {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def _forward_frames_of_failure(rerun) -> list[tuple[str, int]]:
    """The forward call's frames ``(file, line)`` of the op whose backward failed in ``rerun()``
    (the same forward and backward pass again), outermost first: autograd's anomaly mode records
    each op's forward stack and reports it, as a warning, where its backward fails. Empty where
    the pass does not fail again."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly(check_nan=False):
            try:
                rerun()
            except Exception:
                pass
    for w in seen:
        text = str(w.message)
        if "Traceback of forward call that caused the error" in text:
            return [(f, int(n)) for f, n in re.findall(r'File "([^"]+)", line (\d+)', text)]
    return []


@functools.cache
def _gelu_kernel():
    """Torch's own Gelu kernel (F.gelu), for the written-out Gelus of older opsets (:mod:`..passes.gelu`)."""
    from ..registry import REGISTRY
    from . import overrides

    return next(spec for spec in REGISTRY.entries("Gelu", backend="torch") if spec.fn is overrides.gelu)


_programs = itertools.count()


def _own_code(fn):
    """``fn`` with a code object of its own. Dynamo keeps what it compiled, and its recompile
    limit (8), per code object: sharing native_forward's, the ninth model compiled in a process
    ran eagerly without a word."""
    name = f"{fn.__name__}_{next(_programs)}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


# torch._dynamo settings while a compiled program runs (a test sets trace_numpy=True to see a
# trace fail as it did before).
_DYNAMO_CONFIG = {"trace_numpy": False}


def _compile_failure(exc: Exception) -> bool:
    """Whether ``exc`` came out of torch.compile's tracing or compiling (dynamo marks what it
    raises with the user code's stack) rather than out of the compiled program's run."""
    return (isinstance(exc, torch._dynamo.exc.TorchDynamoException)
            or torch._dynamo.exc.get_real_stack(exc) is not None)


def _trace_error(exc: Exception) -> JitTraceError:
    """One line for a torch.compile failure: the error's type and first line (the backend
    compiler's own error for BackendCompilerFailed), and where in the generated code it was."""
    inner = getattr(exc, "inner_exception", None) or exc
    first = next((line.strip() for line in str(inner).splitlines() if line.strip()), "no message")
    stack = torch._dynamo.exc.get_real_stack(exc) or []
    return JitTraceError(f"torch.compile failed: {type(inner).__name__}: {first}",
                         [(frame.filename, frame.lineno) for frame in stack])


__all__ = ["TorchBackend"]
