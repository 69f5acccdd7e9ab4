"""Tensors with a CPU face and a meta body: what the simulation runs the step on.

A `Phantom` says it lives on the CPU, so autocast, SDPA's choice of kernel and every device
test in the model's code take the path a real CPU tensor takes; it holds a meta tensor
(`elem`) of the same size, strides and dtype, on which its ops run: shapes, dtypes and
aliasing without a byte of data. Two phantoms share storage exactly when their bodies do
(`storage`), which is what the memory tracker counts.

`PhantomMode` sends each op to the bodies and wraps what comes back, and makes on meta the
factories asked for the CPU. It is what `FakeTensorMode` does, for this one use, at a
fraction of the cost per op (benchmarks/estimate_speed.py):
- a phantom's device is known in C++: the thousands of device queries a step makes never
  reach Python (a fake tensor answers each one there);
- an op that makes new tensors is run once per shape: its outputs' sizes, strides and dtypes
  are remembered, keyed by its inputs' (meta kernels of elementwise ops are Python, 0.2 ms
  each);
- an op that writes into its arguments and returns them returns them without running: a
  meta kernel computes nothing, and such an op changes no size, stride or dtype (the ones
  that do, tagged `inplace_view`, and resize/set, do run).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_CPU = torch.device("cpu")
_META = torch.device("meta")
_RESHAPING = {"aten::resize_", "aten::resize_as_", "aten::set_"}


class Phantom(torch.Tensor):
    """A CPU tensor as far as the model can tell, backed by the meta tensor `elem`."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Phantom:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=_CPU,
        )
        r.elem = elem
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"Phantom({tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        with PhantomMode():
            return func(*args, **(kwargs or {}))


def storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage a tensor's bytes live in (a phantom's: its meta body's)."""
    return t.elem.untyped_storage() if type(t) is Phantom else t.untyped_storage()


def phantom_like(t: torch.Tensor) -> Phantom:
    """A contiguous phantom of `t`'s size and dtype."""
    return Phantom(torch.empty(t.shape, dtype=t.dtype, device=_META))


# -- how an op is run -----------------------------------------------------------------------
_FRESH, _MUTATES, _OTHER, _COMPOSITE = 0, 1, 2, 3
_KIND: dict[Any, tuple[int, tuple[int | str, ...], Any]] = {}


def _kind_of(func: Any) -> tuple[int, tuple[int | str, ...], Any]:
    """(FRESH: new tensors out, nothing written; MUTATES: writes into arguments and returns
    exactly those, which the tuple names by position or keyword; OTHER: views and the rest;
    COMPOSITE: made of other ops (reaches the mode only inside a decomposition); the Python
    function it runs as on phantoms, or None to run on the meta bodies)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return _COMPOSITE, (), None
    schema = func._schema
    returns = [r.alias_info for r in schema.returns]
    if not schema.is_mutable and all(a is None for a in returns):
        return _FRESH, (), _on_phantoms(func)
    reshapes = torch.Tag.inplace_view in func.tags or schema.name in _RESHAPING
    if reshapes or not all(a is not None and a.is_write for a in returns):
        return _OTHER, (), _on_phantoms(func)
    which: list[int | str] = []
    for alias in returns:
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.before_set == alias.before_set:
                which.append(arg.name if arg.kwarg_only else i)
                break
        else:
            return _OTHER, (), _on_phantoms(func)
    return _MUTATES, tuple(which), None


def _on_phantoms(func: Any) -> Any:
    """Where an op's result depends on the device its inputs are on, the Python function
    FakeTensorMode runs it as, on tensors that say where they live: torch's reference for
    layer norm (whose saved statistics take the input's dtype on the CPU, fp32 elsewhere);
    torch._decomp's decomposition for an op without a Python or trusted C++ meta kernel."""
    import torch._refs
    from torch._decomp import decomposition_table, meta_table
    from torch._subclasses.fake_tensor import FakeTensorMode, torch_decomp_decompositions

    if func is torch.ops.aten.native_layer_norm.default:
        return torch._refs.native_layer_norm
    cpp_meta = torch.Tag.view_copy in func.tags or func in FakeTensorMode._cpp_meta_supports_symint
    if (
        func not in meta_table
        and not cpp_meta
        and func in decomposition_table
        and torch_decomp_decompositions(func)
    ):
        return decomposition_table[func]
    return None


def _key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype)
    if type(x) is list or type(x) is tuple:
        return tuple(_key(v) for v in x)
    return (type(x), x)


def _body(x: Any) -> Any:
    if type(x) is Phantom:
        return x.elem
    if isinstance(x, torch.Tensor):
        return x.to(_META) if x.device.type == "cpu" else x  # a constant made outside
    if type(x) is list or type(x) is tuple:
        return [_body(v) for v in x]
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return Phantom(x) if x.device.type == "meta" else x
    if type(x) is list or type(x) is tuple:
        return type(x)(_wrap(v) for v in x)
    return x


def _describe(x: Any) -> Any:
    """What rebuilds `x` (a fresh output), or None where a rebuild would differ."""
    if isinstance(x, torch.Tensor):
        shape, stride = tuple(x.shape), x.stride()
        rebuilt = torch.empty_strided(shape, stride, dtype=x.dtype, device=_META)
        if x.storage_offset() or storage(x).nbytes() != rebuilt.untyped_storage().nbytes():
            return None
        return ("tensor", shape, stride, x.dtype)
    if type(x) is list or type(x) is tuple:
        parts = [_describe(v) for v in x]
        return None if any(p is None for p in parts) else ("seq", type(x), parts)
    if x is None or type(x) in (int, float, bool):
        return ("value", x)
    return None


def _rebuild(d: Any) -> Any:
    if d[0] == "tensor":
        return Phantom(torch.empty_strided(d[1], d[2], dtype=d[3], device=_META))
    if d[0] == "seq":
        return d[1](_rebuild(p) for p in d[2])
    return d[1]


class PhantomMode(TorchDispatchMode):
    """Runs every op on the phantoms' meta bodies; makes CPU factories on meta.

    transformers skips its data-dependent checks (a packed-sequence test, mask shortcuts)
    for fake tensors, as it must for tensors without values: a phantom counts as one."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing under it is compiled: spare every op the dynamo guard

    _depth = 0  # entries into any PhantomMode (it enters itself to run a decomposition)
    _was: Any = None  # transformers' own test, while patched

    def __enter__(self) -> PhantomMode:
        import transformers.utils.import_utils as iu

        if PhantomMode._depth == 0:
            PhantomMode._was = iu.is_fake_tensor
            iu.is_fake_tensor = lambda x: type(x) is Phantom or PhantomMode._was(x)
        PhantomMode._depth += 1
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        import transformers.utils.import_utils as iu

        PhantomMode._depth -= 1
        if PhantomMode._depth == 0:
            iu.is_fake_tensor = PhantomMode._was
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind, which, impl = _KIND.get(func) or _KIND.setdefault(func, _kind_of(func))
        if kind == _COMPOSITE:
            with self:
                return func.decompose(*args, **kwargs)
        if kind == _MUTATES:
            got = [kwargs[w] if type(w) is str else args[w] for w in which]
            return None if not got else got[0] if len(got) == 1 else tuple(got)
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cpu":
            kwargs = {**kwargs, "device": _META}
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
        key = None
        if kind == _FRESH:
            key = (func, _key(args), _key(tuple(kwargs.items())), torch.get_default_dtype())
            try:
                known = _OUTPUTS.get(key)
            except TypeError:  # an argument that cannot be a key: run the op every time
                known = key = None
            if known is not None:
                return _rebuild(known)
        if impl is not None:
            with self:
                out = impl(*args, **kwargs)
            inputs: Any = args
        else:
            inputs = _body(args)
            out = _wrap(func(*inputs, **{k: _body(v) for k, v in kwargs.items()}))
        if key is not None:
            if _storages(out) & _storages(inputs):  # a view its schema does not say
                _KIND[func] = (_OTHER, (), impl)  # (_unsafe_view)
            else:
                described = _describe(out)
                if described is not None:
                    if len(_OUTPUTS) >= _MOST_OUTPUTS:
                        _OUTPUTS.clear()
                    _OUTPUTS[key] = described
        return out


# (op, inputs' sizes, strides and dtypes, options) -> outputs' sizes, strides and dtypes:
# on meta tensors nothing else can change an output, so it holds for the whole process.
# A model adds about 600 (0.5 MB); a long-lived process (the dashboard) starts again after
# about 80 models
_OUTPUTS: dict[Any, Any] = {}
_MOST_OUTPUTS = 50_000


def _storages(x: Any) -> set[int]:
    if isinstance(x, torch.Tensor):
        return {id(storage(x))}
    if type(x) is list or type(x) is tuple:
        return set().union(*(_storages(v) for v in x))
    return set()
