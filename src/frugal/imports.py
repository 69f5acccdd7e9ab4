"""Third-party imports kept cheap: bitsandbytes' `torch.compile` waits for a first call.

bitsandbytes decorates its CPU kernels and its 32-bit optimizer with `torch.compile` when it is
imported, and peft imports bitsandbytes whenever it is installed, for every job. Each such
decoration looks up the inductor backend, which imports `torch._inductor`: 1.6 s of the 7 s
that `import torch, transformers, peft` took on two cores, paid by every `frugal train` and
every process that simulates a step, although a LoRA job never calls those kernels and a CUDA
QLoRA job calls bitsandbytes' CUDA ones.

`install()` (run by `import frugal`) puts a finder on `sys.meta_path` that, while the
`bitsandbytes` package itself executes, turns `torch.compile(fn, ...)` into a function that
compiles `fn` on its first call with the same arguments: what bitsandbytes gets is the same,
compiled when first used instead of when imported. Nothing else is changed: the finder
removes itself when that one import runs, and `torch.compile` of anything but a plain function
(a module, a method) goes straight to torch.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

DEFERRED = "bitsandbytes"


def compile_on_first_call(real: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for `torch.compile` (`real`) whose result compiles on its first call."""

    def compile_(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(...)
            return lambda fn: compile_(fn, **kwargs)
        if not isinstance(model, types.FunctionType):
            return real(model, **kwargs)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def call(*args: Any, **kw: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **kwargs)
            return compiled(*args, **kw)

        return call

    return compile_


class _CompileLater:
    """A `sys.meta_path` finder (a `find_spec` method is all one needs; subclassing
    importlib.abc's would import importlib.resources, 40 ms on every command)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: Any = None
    ) -> ModuleSpec | None:
        if name != DEFERRED:
            return None
        # the spec the other finders give (peft and transformers also ask for it only to
        # learn whether bitsandbytes is installed: each asking gets its own)
        uninstall()
        try:
            spec = importlib.util.find_spec(name)
        finally:
            install()
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            import torch

            uninstall()  # bitsandbytes is being imported: once is all
            real = torch.compile
            torch.compile = compile_on_first_call(real)
            try:
                execute(module)
            finally:
                torch.compile = real

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _CompileLater()


def install() -> None:
    """Defer bitsandbytes' compilations, unless it is imported already."""
    if DEFERRED not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
