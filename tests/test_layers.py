"""The architecture rules that import-linter cannot express (the layer contract itself is
in pyproject.toml and runs in `make lint`; it also runs here so `make test` holds it).

Function-level imports are allowed only at the torch boundary: a module that pulls in torch
(or one of the libraries built on it, or a large optional one) is imported where it is used,
so that `--help`, `models`, cached `estimate` and `plan` start without it. Everything else
is imported at the top of the module, where a reader looks for it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = {  # third-party imports that cost more than they give on the light paths
    "torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes", "safetensors",
    "matplotlib", "tensorboard", "mlflow", "wandb", "pyarrow", "huggingface_hub", "alembic",
    "sqlalchemy",  # the ledger: commands that do not keep books start without it
    "fastapi", "uvicorn", "starlette", "jinja2", "plotly", "playwright",  # the dashboard
}  # fmt: skip


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, at function level, line) for every import in `path`."""
    module, tree = _module(path), ast.parse(path.read_text())
    top = {id(n) for n in tree.body} | {
        id(n)
        for stmt in tree.body
        if isinstance(stmt, ast.If | ast.Try)  # `if TYPE_CHECKING:` and try/except imports
        for n in ast.walk(stmt)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, path.name == "__init__.py")
            names = [base]
            if base.startswith("frugal"):  # `from frugal.x import y` may name module y
                names = [
                    f"{base}.{a.name}" if _find(f"{base}.{a.name}") else base for a in node.names
                ]
        else:
            continue
        out += [(n, id(node) not in top, node.lineno) for n in names]
    return out


@cache
def _find(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if module.startswith("frugal") and path.is_file():
            return path
    return None


_VISITING: set[str] = set()


@cache
def _pulls_heavy(module: str) -> bool:
    """Whether importing frugal `module` imports a heavy library (at its top level); a
    module met again while its own imports are walked (a cycle: `if TYPE_CHECKING:`
    imports count as top level here) adds nothing new."""
    path = _find(module)
    if path is None or module in _VISITING:
        return False
    _VISITING.add(module)
    try:
        for name, lazy, _ in _imports(path):
            if lazy:
                continue
            if name.split(".")[0] in HEAVY or (name.startswith("frugal.") and _pulls_heavy(name)):
                return True
        return False
    finally:
        _VISITING.discard(module)


def test_function_level_imports_only_at_the_torch_boundary():
    bad = []
    for path in sorted((SRC / "frugal").rglob("*.py")):
        for name, lazy, line in _imports(path):
            heavy = name.split(".")[0] in HEAVY or (
                name.startswith("frugal") and _pulls_heavy(name)
            )
            if lazy and not heavy:
                bad.append(f"{path.relative_to(SRC)}:{line} imports {name} inside a function")
    assert not bad, "move these to the top of their module:\n" + "\n".join(bad)


def test_the_layer_contract_holds():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    out = subprocess.run(
        [lint, "--no-cache"], cwd=SRC.parent, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_test_modules_do_not_import_each_other():
    """Shared test helpers live in conftest.py; a test module never imports another."""
    tests = Path(__file__).resolve().parent
    bad = [
        f"{path.name}:{node.lineno}"
        for path in sorted(tests.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            n.split(".")[0].startswith("test_")
            for n in (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
        )
    ]
    assert not bad, "move the shared helpers to conftest.py: " + ", ".join(bad)


# a newcomer reads a module in one sitting, a function on one screen, a call at a glance
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 60, 8


def test_modules_functions_and_parameter_lists_stay_small() -> None:
    """No module over 500 lines, no function over 60, no function with more than 8
    parameters (self and **kwargs of a typed record aside); Alembic's migrations aside."""
    too_long, too_many = [], []
    for path in sorted((SRC / "frugal").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        where = str(path.relative_to(SRC))
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                too_long.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
            a = node.args
            named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            n = len(named) - (1 if named and named[0].arg in ("self", "cls") else 0)
            if n > MAX_PARAMETERS:
                too_many.append(f"{where}:{node.lineno} {node.name}: {n} parameters")
    assert not too_long, too_long
    assert not too_many, too_many  # a command's options: a dataclass (cli.options.takes)


def _graph() -> dict[str, set[str]]:
    """frugal's modules and the frugal modules each imports anywhere: at its top level, in
    a function (the torch boundary's lazy imports), or for `TYPE_CHECKING` (a type a module
    needs is a concept it depends on)."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / "frugal").rglob("*.py")):
        deps = {n for n, _, _ in _imports(path) if n.startswith("frugal.")}
        out[_module(path)] = {d for d in deps if _find(d)}
    return out


def test_no_two_modules_import_each_other_even_lazily_or_for_types() -> None:
    """A circle of imports, even a lazy or a type-only one, says a concept sits in the wrong
    home (`cli/plan_cmd` <-> `cli/jobs_cmd` over PlanOptions, `hardware/offers` <->
    `hardware/sanity` over Offer; `step/job` -> `step/tasks/distill` -> `step/model` ->
    `step/job`, a task that built its own teacher): each module's imports reach back to it
    nowhere. A package's `__init__` importing its own modules is not a circle."""
    graph = _graph()
    circles = []
    for start in graph:
        seen, stack = set(), [(start, [start])]
        while stack:
            here, path = stack.pop()
            for nxt in graph.get(here, ()):
                if nxt == start and not start.startswith(nxt + ".") and len(path) > 1:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen and not nxt.startswith(start + "."):
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not circles, "\n".join(sorted(set(circles))[:20])
