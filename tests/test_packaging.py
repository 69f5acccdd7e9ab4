"""The distribution a user installs: its name, its extras, what it imports, what it ships."""

from __future__ import annotations

import ast
import email.parser
import re
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "frugal"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out)],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    (path,) = out.glob("frugal_ft-*.whl")
    return zipfile.ZipFile(path)


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return email.parser.Parser().parsestr(wheel.read(name).decode())


def _requires(meta: email.message.Message) -> dict[str, str]:
    """Requirement name -> its environment marker ('' for the base dependencies)."""
    out = {}
    for req in meta.get_all("Requires-Dist") or []:
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        out[name] = req.partition(";")[2].strip()
    return out


@pytest.mark.slow
def test_the_name_is_ours_and_the_command_is_frugal(wheel: zipfile.ZipFile) -> None:
    meta = _metadata(wheel)
    assert meta["Name"] == "frugal-ft"  # `frugal` on PyPI is an unrelated project
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "frugal = frugal.cli.main:run" in wheel.read(entry).decode()
    extras = {"train", "plot", "tracking", "postgres", "dashboard", "gpuhunt", "dev"}
    assert set(meta.get_all("Provides-Extra") or []) == extras
    req = _requires(meta)
    assert 'extra == "train"' in req["bitsandbytes"] and "linux" in req["bitsandbytes"]
    assert 'extra == "plot"' in req["matplotlib"]
    assert 'extra == "tracking"' in req["mlflow"] and 'extra == "tracking"' in req["wandb"]
    assert req["tensorboard"] == ""  # the default logger: a dependency, not optional
    assert 'extra == "postgres"' in req["psycopg"]  # the driver of postgresql+psycopg:// URLs


def _imported_modules() -> set[str]:
    names = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"frugal"}


def test_every_package_the_code_imports_is_declared(wheel: zipfile.ZipFile) -> None:
    """Each third-party import is a dependency or in an extra: none installed by luck."""
    declared = set(_requires(_metadata(wheel)))
    dists = packages_distributions()
    missing = {}
    for module in _imported_modules():
        owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not owners & declared:
            missing[module] = sorted(owners)
    assert not missing, f"imported but not declared: {missing}"


def test_the_wheel_ships_every_data_file_the_code_reads(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    data = (".json", ".csv", ".mako", ".html", ".js", ".css", ".j2")  # catalogs, migrations,
    # pages, emitted scripts
    shipped = [p for p in SRC.rglob("*") if p.suffix in data and p.is_file()]
    shipped += list((SRC / "frugal" / "ledger" / "migrations").rglob("*.py"))
    assert len(shipped) > 40  # bundled model configs, GPU specs, offers, providers
    for p in shipped:
        assert f"frugal/{p.relative_to(SRC).as_posix()}" in names, p
