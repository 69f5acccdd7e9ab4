"""Entry point: `frugal` with its sub-commands, and the one place errors become exit codes.

Exit codes: 0 ok; 2 bad input or no feasible answer (one line on stderr naming the fix);
1 a bug (a traceback only with --debug); 75 training stopped by a signal with a checkpoint
saved (run it again to resume); 130 interrupted by a second Ctrl-C (or by Ctrl-C outside
training): what was saved before is intact.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

from frugal import cli
from frugal.errors import INTERRUPTED_EXIT, FrugalError

# each sub-command by its module and the name in it (a command's function, or a group's
# Typer), in the order `--help` lists them: a command imports its own module when it runs,
# not every other command's (a `frugal train` process started 0.5 s sooner)
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": ("estimate_cmd", "estimate"),
    "models": ("models_cmd", "models"),
    "plan": ("plan_cmd", "plan"),
    "init": ("init_cmd", "init"),
    "gpus": ("catalog_cmd", "gpus"),
    "train": ("train_cmd", "train"),
    "calibrate": ("calibrate_cmd", "calibrate"),
    "dashboard": ("dashboard_cmd", "dashboard"),
    "tco": ("tco_cmd", "tco_cmd"),
    "lifecycle": ("lifecycle_cmd", "lifecycle"),
    "offers": ("catalog_cmd", "offers_app"),
    "data": ("data_cmd", "app"),
    "budget": ("budget_cmd", "app"),
    "costs": ("costs_cmd", "app"),
    "serve": ("serve_cmd", "app"),
}


def _load(name: str) -> Any:
    """The click command `name`, its module imported now."""
    module, attr = COMMANDS[name]
    obj = getattr(importlib.import_module(f"frugal.cli.{module}"), attr)
    if isinstance(obj, typer.Typer):
        cmd: Any = typer.main.get_group(obj)
    else:
        one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        one.command(name)(obj)
        cmd = typer.main.get_command(one)
    cmd.name = name
    return cmd


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands by name, each loaded (`_load`) when it is first asked for: its
    names are known without loading any."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self.loaded[name] = _load(name)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self.loaded

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self.loaded]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*COMMANDS, *self.loaded]))


class LazyGroup(TyperGroup):
    """frugal's root command: its sub-commands loaded as they are run (`LazyCommands`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lazy = LazyCommands()
        lazy.update(self.commands)
        self.commands = lazy

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)


app = typer.Typer(
    cls=LazyGroup,
    help="frugal: exact memory, FLOPs and cost for fine-tuning LLMs, before you spend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_DEBUG = False
_VERBOSE = False
INTERRUPTED = "interrupted: run the command again (what was saved before is intact)"
# a file system's answer about a path the user gave: theirs to fix (one line, exit 2)
PATH_ERRORS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENAMETOOLONG,
    errno.EROFS,
    errno.ELOOP,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ETXTBSY,
    errno.EEXIST,
}


def _click_exceptions() -> Any:
    """typer >= 0.2x vendors click as typer._click; older ones use click itself."""

    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:
        return importlib.import_module("click.exceptions")


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    offline: bool = typer.Option(
        False,
        "--offline",
        help="Never use the network (as HF_HUB_OFFLINE=1): hub ids from the cache only.",
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Say on stderr which memory profiles were simulated, and where the others came "
        "from (the simulations are what makes a first plan or estimate slow).",
    ),
) -> None:
    global _DEBUG, _VERBOSE
    _DEBUG = debug
    _VERBOSE = verbose
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"


def main(argv: list[str] | None = None) -> int:
    global _VERBOSE
    _VERBOSE = False
    before = _profiles_so_far()  # main() may run more than once in a process (the tests)
    try:
        return _main(argv)
    finally:
        if _VERBOSE:
            _say_profiles(before)


def _profiles_so_far() -> tuple[list[Any], Counter[str]]:
    core = sys.modules.get("frugal.estimate.core")
    if core is None:
        return [], Counter()
    return list(core.SIMULATED), Counter(core.cache.FOUND)


def _say_profiles(before: tuple[list[Any], Counter[str]]) -> None:
    """--verbose: the profiles this command simulated (each with its cost and why), and how
    many it found cached or shipped."""
    simulated, found = _profiles_so_far()
    simulated = simulated[len(before[0]) :]
    found -= before[1]
    for s in simulated:
        print(s.line(), file=sys.stderr)
    print(
        f"profiles: {len(simulated)} simulated, {found['cached']} from the cache, "
        f"{found['shipped']} shipped with frugal",
        file=sys.stderr,
    )


def _main(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    cx = _click_exceptions()
    cli.ARGV = list(args)  # in the package: this module may be running as __main__
    try:
        # without standalone mode, click returns (not raises) the code of a typer.Exit
        rc = app(args=args, prog_name="frugal", standalone_mode=False)
    except FrugalError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except cx.NoArgsIsHelpError:
        return 0
    except cx.UsageError as e:
        if debug:
            raise
        where = f" (see: {e.ctx.command_path} --help)" if e.ctx and e.ctx.parent else ""
        # a parser's ValueError reaches click through pydantic, which prefixes its kind
        msg = e.format_message().replace("Value error, ", "")
        print(f"error: {msg}{where}", file=sys.stderr)
        return 2
    except (typer.Exit, getattr(cx, "Exit", typer.Exit)) as e:
        return int(getattr(e, "exit_code", 0))
    except (typer.Abort, getattr(cx, "Abort", typer.Abort)) as e:
        # click turns a KeyboardInterrupt, and also any EOFError, into Abort
        if isinstance(e.__context__, EOFError):
            if debug:
                raise
            return _failed(e.__context__)
        print(INTERRUPTED, file=sys.stderr)
        return INTERRUPTED_EXIT
    except KeyboardInterrupt:  # Ctrl-C outside training's own handling (loading, planning)
        if debug:
            raise
        print(INTERRUPTED, file=sys.stderr)
        return INTERRUPTED_EXIT
    except BrokenPipeError:  # `frugal ... --json | head`: the reader stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if debug:
            raise
        return _failed(e)
    return rc if isinstance(rc, int) else 0


def _failed(e: BaseException) -> int:
    """The one line of an error nobody caught, and its exit code: a path or the ledger's
    database is the user's to fix (2); anything else is a bug in frugal (1)."""
    if isinstance(e, OSError) and e.filename is not None and e.errno in PATH_ERRORS:
        # the file system's answer about a path the user gave: theirs to fix
        print(f"error: {e.filename}: {e.strerror}: check the path and the disk", file=sys.stderr)
        return 2
    if type(e).__module__.startswith("sqlalchemy"):  # the ledger's database, once open
        why = str(getattr(e, "orig", None) or e).strip().splitlines()[0][:200]
        print(
            f"error: the ledger's database failed ({why}): check FRUGAL_DB_URL, or move "
            "a damaged ledger file aside (it was not changed)",
            file=sys.stderr,
        )
        return 2
    print(
        f"internal error ({type(e).__name__}: {e}); this is a bug in frugal, "
        "rerun with --debug for the traceback",
        file=sys.stderr,
    )
    return 1


def run() -> None:
    """The `frugal` console script: `main()`, then a quick exit.

    Tearing down an interpreter that has loaded torch, transformers and peft takes most of
    a second (module finalizers, thread pools) and saves nothing: every file frugal writes
    is closed by then. So flush the streams and leave at once.
    """
    code = main()
    if "torch" not in sys.modules:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
