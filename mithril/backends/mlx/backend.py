"""The MLX backend: the generated program over a NumPy-compatible facade of ``mlx.core``,
compiled whole with ``mx.compile``; gradients by ``mx.value_and_grad``."""

from __future__ import annotations

import contextlib
import functools
import platform
import sys

import numpy as np

from ...dtypes import as_dtype, is_floating_np
from ...errors import BackendOptionError, BackendUnavailableError, DeviceFallbackWarning, MeshError, MithrilError
from ..backend import Backend
from ..options import device_kind, parse_bytes, warn_user
from ..mesh import parse_mesh

# Imported by the first MlxBackend(), so `import mithril` never imports mlx; _mmesh (this folder's
# mesh.py, mlx.core.distributed) by the first one with a mesh of several devices.
mx = xp = _mmesh = None


def _import_mlx() -> None:
    global mx, xp
    if mx is None:
        try:
            import mlx.core as _mx

            from . import xp as _xp
        except ImportError as exc:
            raise BackendUnavailableError(f"MlxBackend needs mlx ({exc}): pip install mithril[mlx]") from exc
        mx, xp = _mx, _xp


def _present_devices() -> list[str]:
    kinds = {"cpu": mx.cpu, "gpu": mx.gpu}
    return [name for name, kind in kinds.items() if mx.is_available(mx.Device(kind))]


def _device_name(backend, device) -> str:
    """``"cpu"``, ``"gpu"``, ``"gpu:0"``, ``mx.cpu``/``mx.gpu`` or an ``mx.Device`` -> ``"cpu"``
    or ``"gpu"``; anything else is an error naming the spellings."""
    if isinstance(device, mx.Device):
        device = device.type
    if isinstance(device, mx.DeviceType):
        return device.name
    kind, _ = device_kind(backend, device, ("cpu", "gpu"))
    return kind


def _parse_device(backend, device):
    """The mx.Device for ``device``; an absent GPU warns once and gives the CPU."""
    name = _device_name(backend, device)
    if name not in _present_devices():
        warn_user(f"MlxBackend: device {name!r} is not present (present devices: {', '.join(_present_devices())}); "
                  "running on cpu", DeviceFallbackWarning)
        name = "cpu"
    return mx.Device(mx.cpu if name == "cpu" else mx.gpu)


_COMPUTE_PRECISIONS = ("float32", "float16", "bfloat16")


def _on_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _unwrap(tree):
    """Facade arrays -> mx.arrays through dicts, lists and tuples."""
    if isinstance(tree, dict):
        return {k: _unwrap(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_unwrap(v) for v in tree)
    return tree.native if isinstance(tree, xp.MlxArray) else tree


def _wrap(tree):
    if isinstance(tree, dict):
        return {k: _wrap(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_wrap(v) for v in tree)
    return xp.MlxArray(tree) if isinstance(tree, mx.array) else tree


def _only_arrays(tree) -> bool:
    if isinstance(tree, dict):
        return all(_only_arrays(v) for v in tree.values())
    return isinstance(tree, mx.array)


class _Compiled:
    """``mx.compile`` of the whole generated forward. A trace failure raises: ``evaluate`` then
    runs the forward op by op and stays so (with a JitFallbackWarning). Calls with host-only
    inputs (strings) run op by op here, silently. Graphs with random draws never get here:
    compile reads the kernels' ``nondeterministic`` metadata and keeps them eager on every backend."""

    def __init__(self, backend: "MlxBackend", forward, shapeless: bool = False):
        self.backend = backend
        self.forward = forward
        self._compiled = mx.compile(self._native_forward, shapeless=shapeless)

    def _native_forward(self, params, data):
        return _unwrap(self.forward(_wrap(params), _wrap(data)))

    def __call__(self, params, data):
        params, data = _unwrap(dict(params)), _unwrap(dict(data))
        with mx.stream(self.backend._device):
            if self._compiled is not None and _only_arrays(params) and _only_arrays(data):
                return _wrap(self._compiled(params, data))
            return self.forward(_wrap(params), _wrap(data))

    @property
    def compiled(self) -> bool:
        return self._compiled is not None


class MlxBackend(Backend):
    """Runs lowered ONNX graphs on Apple's MLX (CPU, or the GPU where present).

    Users see ``mx.array`` everywhere: ``evaluate`` takes mx.arrays (or NumPy arrays, kept at
    their dtype) and returns mx.arrays, gradients are mx.arrays, and the tensor API (``array``,
    ``zeros``, ``add``...) takes and returns mx.arrays. Inside, the shared kernels run on
    :class:`~mithril.backends.mlx.xp.MlxArray`, a NumPy-compatible facade whose ``.native``
    is the ``mx.array`` (``prepare_inputs`` wraps, ``finalize_outputs`` unwraps). ``compile(..., jit=True)`` compiles the whole graph with
    ``mx.compile``. MLX has no float64 on its default CPU path and none on the GPU: graphs
    holding it are reported unsupported at compile time. MLX has no strings either; like JAX and
    Torch, strings stay NumPy object arrays on the host, where the string kernels run, and a
    graph fed them runs op by op (mx.compile traces arrays only).

    Options: ``device`` is "cpu", "gpu", ``mx.cpu``/``mx.gpu`` or an ``mx.Device`` (default:
    the GPU where present; an absent one warns once and runs on the CPU). ``random_seed`` seeds
    the backend (:meth:`set_seed`). ``use_graph`` (or ``jit``) is what ``compile(jit=None)``
    does. ``compute_precision`` is the dtype floating work runs in, params, inputs and outputs
    staying in their own (cast at the program's boundary). ``memory_limit`` (bytes or "4GB")
    calls ``mx.set_memory_limit``, which is process-wide. ``auto_free_tensors`` clears MLX's
    buffer cache after each evaluation. ``enable_mps_optimization`` and ``use_ane`` warn where
    Metal / the Neural Engine are not available (MLX never runs on the Neural Engine).

    **Device meshes** (``device_mesh=(N,)``, ``axis_names``; docs/distributed.md): ``(1,)`` is
    the plain path. ``N > 1`` runs over ``mlx.core.distributed``'s ring backend, one process per
    device, started by ``mlx.launch --backend ring -n N script.py`` (or with ``MLX_RANK`` and
    ``MLX_HOSTFILE`` set); the ring group's size must be N. MLX arrays are local, so the run is
    single-program-multiple-data: every process passes the same whole batch and parameters
    (seed every process alike), and ``evaluate`` returns on every rank what one process
    computes on the whole batch. Data parallel (``compile(..., parallel="data")``, the default
    on a mesh): each rank computes its rows (:meth:`place` cuts the data on dim 0); per-row
    outputs (dim 0 is the batch) are gathered in rank order with ``all_gather``, other outputs
    (a batch-mean loss) averaged over the ranks; parameter gradients are summed over the ranks
    with ``all_sum`` (each rank's is its rows' share of the batch-mean loss, so the sum is the
    one-process gradient), the data's gradients gathered. Tensor parallel
    (``parallel="tensor"``): each process holds only its part of the MatMul weights and
    embedding tables the plan splits (:meth:`place` cuts them; :meth:`gather` joins them), and
    the program all-sums a row-split matmul's partial products and all-gathers split features
    where an op needs them whole (:func:`~.mesh.tensor_parallel_plan`); outputs come back whole,
    a split parameter's gradient as the part its process holds. Fully sharded
    (``parallel="fsdp"``): data parallel, with each parameter held as this rank's part along its
    first dim that divides, gathered whole for each call and its gradient reduced over the ranks
    and cut to the part (:func:`~.mesh.gathered_param`). Pipeline and 2-D meshes are a
    :class:`~mithril.errors.MeshError` (JaxBackend and TorchBackend run them).

    >>> import mithril as ml
    >>> b = ml.MlxBackend(dtype=ml.float32, device="cpu")
    >>> b.add(b.ones(2), b.ones(2)).tolist()
    [2.0, 2.0]
    """

    name = "mlx"
    supports_gradients = True
    jit_option_names = {"shapeless": "mx.compile(shapeless=True): one program for every input shape"}

    def __init__(self, dtype=None, device=None, *, random_seed: int | None = None, compute_precision=None,
                 use_graph: bool = True, jit: bool | None = None, memory_limit=None,
                 auto_free_tensors: bool = False, enable_mps_optimization: bool = False, use_ane: bool = False,
                 device_mesh=None, axis_names=None, **unknown):
        from ... import dtypes

        _import_mlx()
        self._refuse_unknown_options(unknown)
        from . import overrides as _registers_overrides  # noqa: F401

        if jit and use_graph is False:  # use_graph defaults to True: only an explicit False disagrees
            raise BackendOptionError(f"MlxBackend: jit={jit} and use_graph={use_graph} disagree; give one of them")
        self.mesh = parse_mesh("MlxBackend", device_mesh, axis_names)
        self.device_mesh = None if self.mesh is None else self.mesh.shape
        # The mx.distributed group (None on one device: a one-device mesh is the plain path), and
        # the ShardingPlan of the values last placed: the program about to run follows its strategy.
        self._group = self._sharding = None
        if self.mesh is not None and self.mesh.size > 1:
            global _mmesh
            if _mmesh is None:
                from . import mesh as _mesh_module

                _mmesh = _mesh_module
            self._group = _mmesh.join_group(self.mesh)
        if enable_mps_optimization and not _on_apple_silicon():
            warn_user("MlxBackend: enable_mps_optimization=True needs Metal (Apple silicon), which is not here; "
                      "running on cpu")
        if use_ane:
            warn_user("MlxBackend: use_ane=True asks for the Apple Neural Engine, which MLX does not run on"
                      + ("" if _on_apple_silicon() else " (and this is not Apple silicon)") + "; ignored")
        if device is None:
            # MLX's default device: the GPU (Metal) where there is one; enable_mps_optimization asks for it.
            device = "gpu" if enable_mps_optimization or "gpu" in _present_devices() else "cpu"
        self._device = _parse_device(self, device)
        self.xp = xp
        self.jit_by_default = bool(use_graph if jit is None else jit)
        self.use_graph = self.jit_by_default
        self.auto_free_tensors = bool(auto_free_tensors)
        self.memory_limit = None
        if memory_limit is not None:
            self.memory_limit = parse_bytes(memory_limit)
            mx.set_memory_limit(self.memory_limit)  # process-wide: MLX has one allocator
        super().__init__(dtype if dtype is not None else dtypes.float32, self._device.type.name)
        reason = self.unsupported_dtype_reason(self.dtype.numpy)
        if reason:
            raise BackendUnavailableError(f"MlxBackend cannot use dtype {self.dtype!r}: {reason}")
        self.compute_precision = self._compute_precision(compute_precision)
        if random_seed is not None:
            self.set_seed(random_seed)

    def _compute_precision(self, value):
        """``compute_precision``: None (compute in the arrays' own dtypes) or a floating dtype
        MLX computes in ("float32", "float16", "bfloat16", or an ml/mx/NumPy dtype of one)."""
        if value is None:
            return None
        try:
            found = as_dtype(value)
        except MithrilError:
            found = None
        if found is None or found.name not in _COMPUTE_PRECISIONS:
            raise BackendOptionError(f"MlxBackend: compute_precision must be one of {', '.join(_COMPUTE_PRECISIONS)} "
                                     f"(or the ml, mx or NumPy dtype of one), got {value!r}")
        return found

    @classmethod
    def devices(cls) -> list[str]:
        """``"cpu"``, and ``"gpu"`` where MLX has one."""
        _import_mlx()
        return _present_devices()

    def synchronize(self, value) -> None:
        arrays = list(_mx_leaves(value))
        if arrays:
            mx.eval(arrays)  # MLX is lazy: nothing runs until evaluated

    def scope(self):
        """This backend's device as MLX's default stream, for the duration of one call; with
        ``auto_free_tensors``, MLX's buffer cache is released when the call ends."""
        if not self.auto_free_tensors:
            return mx.stream(self._device)
        stack = contextlib.ExitStack()
        stack.callback(mx.clear_cache)
        stack.enter_context(mx.stream(self._device))
        return stack

    # -- device meshes -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the mesh's ring group (0 on one device)."""
        return 0 if self._group is None else self._group.rank()

    @property
    def group(self):
        """The ``mx.distributed.Group`` of the mesh (None on one device), for MLX code of your own."""
        return self._group

    def shard(self, values, spec):
        """This rank's part of ``values`` (the whole array) split by ``spec``: MLX arrays are
        local, so every rank draws the same whole array from the same seed and keeps its part."""
        values = np.asarray(values)
        return self.from_numpy(np.ascontiguousarray(_mmesh.local_part(values, self.mesh, self.rank, tuple(spec))))

    def place(self, values: dict, plan) -> dict:
        """Parameters or data as this process runs them under a
        :class:`~mithril.distributed.ShardingPlan`; NumPy values become mx.arrays, facades stay
        facades. The values given are whole (the same on every rank), or already this rank's
        parts. Data parallel: parameters whole (every rank holds them all), data inputs cut on
        dim 0 to this rank's rows. Tensor parallel: the data whole, each split parameter cut to
        this rank's part (:meth:`local_shape`: the process holds only that; :meth:`gather` gives
        the whole back, for a checkpoint). Fully sharded: the data as under data parallel, the
        parameters as under tensor parallel. Other strategies, several at once, and splits a
        ``sharding=`` rule adds that these do not run are a MeshError."""
        if self._group is None:
            return super().place(values, plan)
        self._check_plan(plan)
        self._sharding = plan
        axis = plan.strategies.get("data") or plan.strategies.get("fsdp")
        out = {}
        for name, v in values.items():
            if name in plan.shapes and self._split(name, plan):
                native = _unwrap(v) if isinstance(v, (xp.MlxArray, mx.array)) else self.from_numpy(np.asarray(v))
                if tuple(native.shape) == tuple(plan.shapes[name]):
                    native = _mmesh.local_part(native, self.mesh, self.rank, plan.spec(name))
                out[name] = xp.MlxArray(native) if isinstance(v, xp.MlxArray) else native
                continue
            if axis is None or name in plan.shapes or not plan.specs.get(name) \
                    or isinstance(v, np.ndarray) and v.dtype == object:
                out[name] = v if isinstance(v, (xp.MlxArray, mx.array)) or not hasattr(v, "shape") \
                    or np.asarray(v).dtype == object else self.from_numpy(np.asarray(v))
                continue
            native = _unwrap(v) if isinstance(v, (xp.MlxArray, mx.array)) else self.from_numpy(np.asarray(v))
            part = _mmesh.local_part(native, self.mesh, self.rank, (axis,) + (None,) * (native.ndim - 1))
            out[name] = xp.MlxArray(part) if isinstance(v, xp.MlxArray) else part
        return out

    def _split(self, name: str, plan) -> bool:
        """Whether this process holds only its part of parameter ``name`` under ``plan``."""
        return ("tensor" in plan.strategies or "fsdp" in plan.strategies) \
            and any(a is not None for a in plan.specs.get(name, ()))

    def local_shape(self, name: str, shape: tuple, plan) -> tuple:
        """Parameter ``name``'s shape as this process holds it: under tensor parallel and fsdp, a
        split parameter's part (``shape`` divided along its split dims)."""
        if self._group is None or not self._split(name, plan):
            return shape
        return _mmesh.local_shape(tuple(shape), self.mesh, plan.spec(name))

    def gather(self, values: dict, plan) -> dict:
        """The whole arrays of ``values`` as :meth:`place` left them under ``plan`` (split
        parameters' parts gathered in rank order with ``all_gather``; the rest as they are): what
        one process holds, e.g. for ``ml.save_params``. Every rank calls it."""
        if self._group is None:
            return dict(values)
        out = {}
        for name, v in values.items():
            native = _unwrap(v) if isinstance(v, (xp.MlxArray, mx.array)) else None
            if native is None or name not in plan.shapes or not self._split(name, plan) \
                    or tuple(native.shape) == tuple(plan.shapes[name]):
                out[name] = v
                continue
            joined = _mmesh.whole(native, self.mesh, self._group, plan.spec(name))
            out[name] = xp.MlxArray(joined) if isinstance(v, xp.MlxArray) else joined
        return out

    def check_sharding(self, plan) -> None:
        if self._group is not None:
            self._check_plan(plan)

    def _check_plan(self, plan) -> None:
        """The plans :meth:`place` runs: data parallel (every parameter whole, every batched data
        input split on dim 0) or tensor parallel (the data whole), over an axis holding every
        process."""
        strategies = sorted(plan.strategies)
        if strategies not in (["data"], ["fsdp"], ["tensor"]):
            raise MeshError(f"MlxBackend runs data, fsdp or tensor parallel over a 1-D device mesh; "
                            f"{' + '.join(strategies)} is not implemented on MLX (JaxBackend and TorchBackend run it): "
                            f"compile with parallel='data', 'fsdp' or 'tensor'")
        (strategy, axis), = plan.strategies.items()
        if self.mesh.axis_size(axis) != self.mesh.size:
            raise MeshError(f"MlxBackend: {strategy} parallel over axis {axis!r} of mesh {self.mesh} leaves other axes "
                            f"unused; give it every process (device_mesh=({self.mesh.size},))")
        if strategy == "fsdp":
            twice = [n for n in plan.shapes if sum(a is not None for a in plan.specs.get(n, ())) > 1]
            if twice:
                raise MeshError(f"MlxBackend splits a parameter on one dim under fsdp; sharding= splits "
                                f"{', '.join(twice[:4])} on several")
        if strategy == "data":
            split_params = [n for n in plan.shapes if n in plan.specs]
            if split_params:
                raise MeshError(f"MlxBackend keeps parameters whole on every process under data parallel; sharding= "
                                f"splits {', '.join(split_params[:4])}")
        for name, shape in plan.input_shapes.items():
            spec = tuple(plan.specs.get(name, ()))
            spec = spec if any(a is not None for a in spec) else ()
            want = (axis,) + (None,) * (len(shape) - 1) if strategy != "tensor" and len(shape) else ()
            if spec != want:
                raise MeshError(f"MlxBackend: under {strategy} parallel, input {name!r} must be "
                                f"{'split on its batch (dim 0) over the ranks' if want else 'whole on every process'}; "
                                f"a sharding= rule places it {spec or 'whole'}")

    def per_device_bytes(self, arrays) -> dict:
        """``{rank: bytes}`` that ``arrays`` (a dict or a list) hold in this process."""
        values = arrays.values() if isinstance(arrays, dict) else arrays
        return {self.rank: sum(_unwrap(v).nbytes for v in values if isinstance(_unwrap(v), mx.array))}

    # -- dtypes and conversion -------------------------------------------------------
    def unsupported_dtype_reason(self, dtype) -> str | None:
        dtype = np.dtype(dtype)
        if dtype == np.float64:
            return "MLX has no float64 on its default CPU path (arrays convert to float32) and none on the GPU"
        if dtype == object:
            return None  # strings: the string kernels run on the host with NumPy
        if not xp.is_supported(dtype):
            return f"MLX has no {dtype} arrays"
        return None

    def from_numpy(self, arr):
        """An ``mx.array`` holding ``arr`` at its exact dtype (float64 is refused); NumPy string
        arrays stay NumPy (the string kernels run on the host)."""
        if isinstance(arr, xp.MlxArray):
            return arr.native
        if isinstance(arr, mx.array):
            return arr
        arr = np.asarray(arr)
        if arr.dtype == object:
            return arr
        reason = self.unsupported_dtype_reason(arr.dtype)
        if reason:
            from ...errors import UnsupportedDTypeError

            raise UnsupportedDTypeError(f"MlxBackend cannot hold {arr.dtype}: {reason}")
        with mx.stream(self._device):
            return mx.array(arr)

    def hold(self, arr):
        """The model's own parameter for ``evaluate(None, ...)``: where ``arr`` is a NumPy view of
        an mx.array's whole memory (what :meth:`share` returns), that mx.array itself, so the
        weights are held once; else an mx.array copy (:meth:`from_numpy`; MLX cannot compute on
        NumPy's memory)."""
        owner = _mx_owner(arr) if isinstance(arr, np.ndarray) else None
        return owner if owner is not None else self.from_numpy(arr)

    def share(self, arr):
        """``arr``'s values held once, in MLX's memory: a read-only NumPy array over an mx.array
        copy of ``arr``, which :meth:`hold` then runs without a copy (the model drops ``arr``).
        Arrays MLX cannot hold or cannot show NumPy (strings, float64, bfloat16) come back as
        they are.

        >>> import numpy as np, mithril as ml
        >>> b = ml.MlxBackend(device="cpu")
        >>> w = b.share(np.ones(3, np.float32))
        >>> w.flags.writeable, b.hold(w) is b.hold(w)
        (False, True)
        """
        arr = np.asarray(arr)
        if arr.dtype == object or self.unsupported_dtype_reason(arr.dtype) or _mx_owner(arr) is not None:
            return arr  # (already MLX's: a model compiled twice keeps one copy)
        native = self.from_numpy(arr)
        mx.eval(native)
        try:
            view = np.asarray(memoryview(native))
        except (TypeError, ValueError, RuntimeError):  # no buffer format NumPy reads (bfloat16)
            return arr
        if view.dtype != arr.dtype or view.shape != arr.shape:
            return arr
        view.flags.writeable = False  # kernels never write into weights; nor may anyone through this view
        return view

    def to_numpy(self, arr) -> np.ndarray:
        if isinstance(arr, list):
            return np.asarray([self.to_numpy(a) for a in arr])
        return xp.to_host(arr)

    def dtype_of(self, value) -> np.dtype | None:
        if isinstance(value, mx.array):
            # float64 (CPU-only in MLX) is not a facade dtype, but a check must still see it.
            return np.dtype(np.float64) if value.dtype == mx.float64 else xp.np_dtype(value.dtype)
        return super().dtype_of(value)

    def prepare_inputs(self, values: dict) -> dict:
        # The program computes on the facade; NumPy arrays keep their dtype (no casting).
        return {k: self._to_facade(v) for k, v in values.items()}

    def constant(self, value: np.ndarray):
        # Converted once at compile instead of by every op that reads it; float64 and strings stay
        # on the host, where the kernels that accept them compute.
        if value.dtype == object or self.unsupported_dtype_reason(value.dtype):
            return value
        if self.compute_precision is not None and is_floating_np(value.dtype):
            value = value.astype(self.compute_precision.numpy)  # computed in compute_precision, as the inputs
        return xp.MlxArray(self.from_numpy(value))

    def _to_facade(self, v):
        if isinstance(v, xp.MlxArray):
            return v
        if isinstance(v, (list, tuple)):  # a sequence input
            return [self._to_facade(x) for x in v]
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype == object:
            return np.asarray(v)  # strings stay on the host
        if isinstance(v, (mx.array, np.ndarray, np.generic)):
            return xp.MlxArray(self.from_numpy(v))
        return v

    def finalize_outputs(self, outputs: dict) -> dict:
        # Users get mx.arrays: facades are unwrapped, values kernels computed on the host (NumPy)
        # become mx.arrays; strings stay NumPy object arrays.
        out = {k: self._to_native(v) for k, v in outputs.items()}
        if self.auto_free_tensors:  # computed now, so the cache released after the call held them
            mx.eval([v for v in out.values() if isinstance(v, mx.array)])
        return out

    def _to_native(self, v):
        if isinstance(v, (list, tuple)):
            return [self._to_native(x) for x in v]
        if isinstance(v, xp.MlxArray):
            return v.native
        if isinstance(v, (np.ndarray, np.generic)) and xp.is_supported(np.asarray(v).dtype):
            return xp.native(np.asarray(v))
        return v

    @classmethod
    def framework_kernel(cls, fn):
        """A kernel over ``mx.array`` (``register_op``) in programs over the facade: native arrays in,
        facade arrays out."""

        @functools.wraps(fn)
        def on_mx_arrays(*inputs, **attributes):
            _import_mlx()
            return _wrap(fn(*_unwrap(inputs), **attributes))

        return on_mx_arrays

    # -- compilation hooks -----------------------------------------------------------
    def lower(self, plan, **kwargs):
        """The generated program; with ``compute_precision``, floating params and inputs are cast
        to it on the way in and floating outputs back to their declared dtypes on the way out; on
        a mesh of several processes, its outputs joined over the ranks (:class:`~.mesh.OnMesh`)."""
        program = super().lower(plan, **kwargs)
        forward = program.forward
        declared = {v.name: xp.mx_dtype(v.dtype) for v in plan.outputs
                    if v.dtype is not None and xp.is_supported(v.dtype)}
        if self.compute_precision is not None:
            forward = _ComputeIn(forward, self.compute_precision, declared)
        if self._group is not None:  # over the ranks, by the strategy place() was last given
            def lower_plan(rewritten):
                lowered = super(MlxBackend, self).lower(rewritten, **kwargs)
                inner = lowered.forward
                if self.compute_precision is not None:
                    inner = _ComputeIn(inner, self.compute_precision, declared)
                return inner, lowered.source

            forward = _mmesh.OnMesh(forward, self._group, self.mesh, plan, _wrap, _unwrap, lower_plan,
                                    lambda: self._sharding)
        return program if forward is program.forward else program.with_forward(forward)

    def jit(self, forward, options: dict | None = None):
        """``mx.compile`` of the whole forward; ``options``: ``shapeless``."""
        options = self.check_jit_options(options)
        return _Compiled(self, forward, shapeless=bool(options.get("shapeless", False)))

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        forward = program.forward  # mx.value_and_grad traces the eager forward
        params, data = _unwrap(dict(params)), _unwrap(dict(data))
        # evaluate has checked each cotangent's dtype and shape against its output.
        cot = {k: _unwrap(self.from_numpy(v))
               for k, v in output_gradients.items()}
        names = list(diff_params) + list(diff_data)

        def loss_and_outputs(primals):
            p, d = dict(params), dict(data)
            for name, value in zip(names, primals):
                (p if name in diff_params else d)[name] = value
            out = _unwrap(forward(_wrap(p), _wrap(d)))
            # The vjp with cotangents g is the gradient of sum(out * g).
            loss = mx.array(0.0)
            for k, g in cot.items():
                loss = loss + mx.sum(out[k].astype(mx.float32) * g.astype(mx.float32))
            return loss, out

        primals = [params[k] for k in diff_params] + [data[k] for k in diff_data]
        with mx.stream(self._device):
            (_, outputs), grads = mx.value_and_grad(loss_and_outputs)(primals)
        grads = dict(zip(names, grads))
        if isinstance(forward, _mmesh.OnMesh if _mmesh is not None else ()):
            grads = forward.reduce(grads)
        if self.auto_free_tensors:
            mx.eval(list(outputs.values()), list(grads.values()))
        return outputs, grads

    # -- devices, random keys, memory, interchange -------------------------------------------
    def to_device(self, x, device):
        """MLX arrays live in unified memory, not on a device: ``x`` itself; a device that is
        not present warns."""
        if _device_name(self, device) not in _present_devices():
            warn_user(f"MlxBackend: device {str(device)!r} is not present (present devices: "
                      f"{', '.join(_present_devices())}); the array stays where it is", DeviceFallbackWarning)
        return self.from_numpy(x) if not isinstance(x, mx.array) else x

    def set_seed(self, seed: int) -> None:
        super().set_seed(seed)
        self._key = mx.random.key(seed)

    def get_random_key(self):
        """A fresh MLX PRNG key (``mx.random.key``) split off the backend's key."""
        self._key, key = mx.random.split(self._key)
        return key

    def split_key(self, key):
        """``mx.random.split``: ``(new_key, subkey)``."""
        new_key, subkey = mx.random.split(key)
        return new_key, subkey

    def random_normal(self, key, shape=(), dtype=None):
        """``mx.random.normal(shape, key=key)`` in ``dtype`` (default: the backend's)."""
        with mx.stream(self._device):
            return mx.random.normal((shape,) if isinstance(shape, int) else tuple(shape),
                                    dtype=xp.mx_dtype(self.backend_dtype(dtype)), key=key)

    def get_memory_info(self) -> dict:
        """MLX's allocator: ``used`` (active), ``peak``, ``cache`` and ``limit``, in MB."""
        mb = 2**20
        return {"used": mx.get_active_memory() / mb, "peak": mx.get_peak_memory() / mb,
                "cache": mx.get_cache_memory() / mb, "limit": mx.get_memory_limit() / mb, "source": "mlx allocator"}

    def to_mlx(self, x):
        """``x`` as an ``mx.array`` (an mx.array itself; NumPy and other arrays are converted)."""
        if isinstance(x, xp.MlxArray):
            return x.native
        if isinstance(x, mx.array):
            return x
        return self.from_numpy(np.asarray(x))

    def from_mlx(self, x):
        """The backend array for an ``mx.array``: the array itself (MLX arrays are this backend's)."""
        if not isinstance(x, (mx.array, xp.MlxArray)):
            from ...errors import InputError

            raise InputError(f"from_mlx takes an mx.array, got {type(x).__name__}")
        return self.to_mlx(x)

    def checkpoint(self, fn, *args):
        """``mx.checkpoint`` of a segment of the generated forward: ``mx.value_and_grad`` keeps
        its arguments and calls it again in the backward pass instead of keeping what it computed."""
        return _checkpointed(fn, args)


_SLOT = object()  # where an array sat in a structure handed to mx.checkpoint


def _checkpointed(fn, args):
    """``mx.checkpoint(fn)(*args)`` over the floating arrays among ``args`` (in sequences too):
    it differentiates its arguments only, so each goes in as one. Other values (integer arrays,
    NumPy arrays of shapes, strings) pass as they are, in and out."""
    arrays: list = []
    hollow = _hollow(args, arrays)
    out = {}

    def on_arrays(*natives):
        result = fn(*_fill(hollow, iter(natives)))
        out_arrays: list = []
        out["hollow"] = _hollow(result, out_arrays)
        return out_arrays

    natives = mx.checkpoint(on_arrays)(*arrays)
    return _fill(out["hollow"], iter(natives))


def _hollow(tree, arrays: list):
    """``tree`` with each floating array replaced by _SLOT, its native appended to ``arrays``
    (integer arrays, indices, pass as they are: MLX refuses a vector-Jacobian product with
    respect to gather indices)."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_hollow(v, arrays) for v in tree)
    if isinstance(tree, (xp.MlxArray, mx.array)) and mx.issubdtype(_unwrap(tree).dtype, mx.floating):
        arrays.append(_unwrap(tree))
        return _SLOT
    return tree


def _fill(tree, natives):
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, natives) for v in tree)
    return xp.MlxArray(next(natives)) if tree is _SLOT else tree


def _native_api(name):
    """The base tensor API method ``name`` over mx.arrays (NumPy semantics, through the facade)."""
    base = getattr(Backend, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        with mx.stream(self._device):
            return _unwrap(base(self, *_wrap(args), **kwargs))

    return method


for _name in ("add", "subtract", "multiply", "divide", "matmul", "maximum", "minimum", "relu", "sigmoid", "tanh",
              "isnan", "sum", "mean", "max", "reshape", "transpose", "concat",
              "power", "negative", "abs", "exp", "log", "sqrt", "sin", "cos", "where", "min"):
    setattr(MlxBackend, _name, _native_api(_name))


class _ComputeIn:
    """compute_precision: floating params and inputs cast to ``dtype`` on the way in, floating
    outputs back to the dtypes the graph declares on the way out."""

    def __init__(self, forward, dtype, declared: dict):
        self.forward, self.dtype, self.declared = forward, xp.mx_dtype(dtype.numpy), declared

    def _in(self, values: dict) -> dict:
        return {k: xp.MlxArray(v.native.astype(self.dtype))
                if isinstance(v, xp.MlxArray) and mx.issubdtype(v.native.dtype, mx.floating) else v
                for k, v in values.items()}

    def __call__(self, params, data):
        out = self.forward(self._in(params), self._in(data))
        return {k: xp.MlxArray(v.native.astype(self.declared[k]))
                if isinstance(v, xp.MlxArray) and k in self.declared and mx.issubdtype(v.native.dtype, mx.floating)
                and v.native.dtype != self.declared[k] else v
                for k, v in out.items()}


MLXBackend = MlxBackend


def _mx_owner(arr: np.ndarray):
    """The mx.array whose whole memory NumPy array ``arr`` views (through a memoryview of it,
    as :meth:`MlxBackend.share` makes), or None: same address, shape and dtype, C-contiguous."""
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if not isinstance(base, memoryview) or not isinstance(base.obj, mx.array) or not arr.flags.c_contiguous:
        return None
    whole = np.asarray(base)
    if (whole.shape != arr.shape or whole.dtype != arr.dtype
            or whole.__array_interface__["data"][0] != arr.__array_interface__["data"][0]):
        return None
    return base.obj


def _mx_leaves(value):
    """The mx.array leaves of nested dicts, lists and tuples (through the array facade)."""
    value = getattr(value, "native", value)
    if isinstance(value, mx.array):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _mx_leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _mx_leaves(v)
