"""Custom ops: register a kernel for an op of your own (or replace one) on one backend or on all
of them, remove it, or scope registrations to a block (docs/custom_ops.md).

``ml.register_op``, ``Backend.register_op`` (``ml.JaxBackend.register_op("gelu", fn)``),
``ml.unregister_op`` and ``ml.scoped_ops`` are these functions; the registry they write to is
:mod:`mithril.backends.registry` (kernels) and :mod:`mithril.backends.vjp` (gradient rules).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..errors import KernelRegistrationError
from .registry import CUSTOM_DOMAIN, REGISTRY, make_spec
from .vjp.rules import RULES

# KernelSpec fields register_op passes through from its keyword arguments.
_OP_METADATA = ("static_inputs", "nondeterministic", "data_dependent_shape", "host_only", "reason")


def _backend_of(backend) -> tuple[str, type | None]:
    """The table ("*": every backend) and the class of a backend given as a name, class or instance."""
    if backend is None or backend == "*":
        return "*", None
    if isinstance(backend, str):
        from .table import BACKENDS

        if backend not in BACKENDS:
            raise KernelRegistrationError(
                f"backend={backend!r} is not a backend; valid names: {', '.join(BACKENDS)} (or None for every backend)")
        return backend, BACKENDS[backend].load()
    cls = backend if isinstance(backend, type) else type(backend)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not callable(getattr(cls, "framework_kernel", None)):
        raise KernelRegistrationError(f"backend={backend!r} is not a backend name, class or instance")
    return name, cls


def check_op(op_type, domain, since) -> str:
    """The domain as the registry keys it (``ai.onnx`` is ``""``), after checking the arguments."""
    if not isinstance(op_type, str) or not op_type:
        raise KernelRegistrationError(f"an op's name is a non-empty string, not {op_type!r}")
    if not isinstance(domain, str):
        raise KernelRegistrationError(f"domain= is a string such as {CUSTOM_DOMAIN!r}, not {domain!r}")
    if isinstance(since, bool) or not isinstance(since, int) or since < 1:
        raise KernelRegistrationError(f"since= is the domain's opset version the kernel holds from (an int >= 1), "
                                      f"not {since!r}")
    return "" if domain == "ai.onnx" else domain


def register_op(op_type: str, fn: Callable | None = None, *, backend=None, domain: str = CUSTOM_DOMAIN,
                since: int = 1, output_shapes: Callable | None = None, vjp: Callable | None = None,
                replace: bool = False, **meta):
    """Register ``fn`` as the kernel of op ``op_type`` in ``domain`` (``mithril.custom`` unless
    given), from the domain's opset version ``since`` on, on one backend or on all of them.

    ``fn`` takes the node's inputs positionally and its attributes as keyword-only parameters,
    like the built-in kernels (module docstring), and returns an array or a tuple of arrays. With
    ``backend=None`` it is shared by every backend and should compute over the ``xp`` keyword it
    may declare (numpy, jax.numpy, torch, mlx.core behind a facade); with ``backend="jax"`` (a
    name, a backend class or an instance) it is that backend's and may use its framework
    directly (``jnp``, ``torch``, ``mx``). Usable as a decorator (``fn`` left out) or a call;
    returns ``fn``. ``Backend.register_op`` is this with ``backend`` set.

    ``output_shapes(inputs, attributes)``: one ``(shape, dtype)`` per output from the inputs'
    ``(static shape or None, numpy dtype or None)``; lets shapes after the op be known at compile
    and gives ``ml.CustomOp`` its shape rule. ``vjp``: the op's vector-Jacobian rule in NumPy
    (``mithril.backends.vjp``), for the NumPy backend's gradients (JAX, Torch and MLX
    differentiate ``fn`` themselves). A second ``register_op`` of the same op replaces the first;
    a built-in kernel or an ``@kernel``/``@override`` one is replaced only with ``replace=True``.
    Other keywords are kernel metadata: ``static_inputs``, ``nondeterministic``,
    ``data_dependent_shape``, ``host_only``, ``reason``.

    >>> import numpy as np, mithril as ml
    >>> with ml.scoped_ops():
    ...     @ml.register_op("scaled_tanh")
    ...     def scaled_tanh(x, *, scale=1.0, xp):
    ...         return scale * xp.tanh(x)
    ...     ml.backends.registry.REGISTRY.where("scaled_tanh", "mithril.custom")
    ['*']
    """
    table, cls = _backend_of(backend)
    domain = check_op(op_type, domain, since)
    unknown = sorted(set(meta) - set(_OP_METADATA))
    if unknown:
        raise KernelRegistrationError(f"register_op({op_type!r}) has no option(s) {', '.join(unknown)}; kernel "
                                      f"metadata it takes: output_shapes, vjp, replace, {', '.join(_OP_METADATA)}")
    for what, value in (("output_shapes", output_shapes), ("vjp", vjp)):
        if value is not None and not callable(value):
            raise KernelRegistrationError(f"register_op({op_type!r}): {what}= is a function, not {value!r}")

    def wrap(fn):
        if not callable(fn):
            raise KernelRegistrationError(f"register_op({op_type!r}) registers a function, not {fn!r}")
        # A backend whose program computes on a facade (MLX) hands fn its framework's own arrays.
        kernel_fn = fn if cls is None else cls.framework_kernel(fn)
        spec = make_spec(kernel_fn, op_type, domain, since, output_shapes=output_shapes, custom=True, **meta)
        REGISTRY.register(table, spec, replace=replace)
        if vjp is not None:
            RULES.register("*", make_spec(vjp, op_type, domain, since, custom=True), replace=replace)
        return fn

    return wrap if fn is None else wrap(fn)


def unregister_op(op_type: str, *, backend=None, domain: str = CUSTOM_DOMAIN, since: int | None = None) -> None:
    """Remove what :func:`register_op` registered for ``op_type`` on ``backend`` (None: the
    shared kernel), every version unless ``since`` is given, with its gradient rule when no
    kernel of that op and version is left. Mithril's own kernels are not removed (register a
    replacement with ``replace=True``)."""
    table, _ = _backend_of(backend)
    domain = check_op(op_type, domain, since if since is not None else 1)
    specs = [s for s in REGISTRY.entries(op_type, domain, table) if since is None or s.since == since]
    if not specs:
        where = "shared" if table == "*" else f"{table!r}"
        raise KernelRegistrationError(f"no {where} kernel of {domain + '::' if domain else ''}{op_type}"
                                      f"{'' if since is None else f'-{since}'} is registered")
    builtin = [s for s in specs if s.builtin]
    if builtin:
        raise KernelRegistrationError(f"kernel {builtin[0].name} is Mithril's own ({builtin[0].location}); "
                                      "register a replacement with replace=True instead of removing it")
    for spec in specs:
        REGISTRY.unregister(table, op_type, spec.since, domain)
        if not REGISTRY.where(op_type, domain):
            for rule in RULES.entries(op_type, domain):
                if rule.custom and rule.since == spec.since:
                    RULES.unregister("*", op_type, spec.since, domain)


@contextlib.contextmanager
def scoped_ops():
    """Kernels and gradient rules registered inside the block (``register_op``, ``@kernel``,
    ``@override``, ``@vjp_rule``) are removed at its end, and those they replaced come back: for
    tests and experiments. Mithril's own modules imported meanwhile keep their registrations.

    >>> import mithril as ml
    >>> with ml.scoped_ops():
    ...     _ = ml.NumpyBackend.register_op("double", lambda x: 2 * x)
    >>> ml.backends.registry.REGISTRY.where("double", "mithril.custom")
    []
    """
    with REGISTRY.scoped(), RULES.scoped():
        yield


__all__ = ["register_op", "scoped_ops", "unregister_op"]
