"""frugal/imports.py: bitsandbytes' torch.compile waits for a first call, so importing peft
(which imports bitsandbytes) no longer imports torch's inductor."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from frugal.imports import compile_on_first_call


def test_importing_peft_after_frugal_leaves_inductor_unimported() -> None:
    code = (
        "import importlib.util, sys, frugal\n"
        # peft and transformers look bitsandbytes up before they import it
        "for _ in range(2):\n"
        "    assert importlib.util.find_spec('bitsandbytes')\n"
        "import peft, bitsandbytes.optim\n"
        "assert bitsandbytes.optim.AdamW8bit\n"
        "print('torch._inductor.compile_fx' in sys.modules,\n"
        "      frugal.imports._FINDER in sys.meta_path)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]  # deferred, and the finder is gone


def test_a_deferred_compile_runs_on_the_first_call_with_its_arguments() -> None:
    made: list[tuple[Any, dict[str, Any]]] = []

    def real(model: Any = None, **kwargs: Any) -> Any:
        made.append((model, kwargs))
        return lambda *a, **k: ("compiled", model(*a, **k))

    compile_ = compile_on_first_call(real)

    def double(x: int) -> int:
        return 2 * x

    fn = compile_(double, dynamic=False)
    decorated = compile_(dynamic=True)(double)
    assert made == [] and fn.__name__ == "double"  # nothing compiled at decoration
    assert fn(3) == ("compiled", 6) and fn(4) == ("compiled", 8)
    assert decorated(1) == ("compiled", 2)
    assert made == [(double, {"dynamic": False}), (double, {"dynamic": True})]  # once each

    class Module:
        pass

    module = Module()
    compile_(module, mode="max-autotune")  # not a plain function: straight to torch
    assert made[-1] == (module, {"mode": "max-autotune"})
