"""The `frugal` command line: thin commands that parse, call the library and print."""

from rich.console import Console

ARGV: list[str] = []  # the running command's arguments (`frugal train` relaunches them)


def console() -> Console:
    """stdout's console; 120 columns when it is not a terminal (a pipe, a file, a test),
    so tables are not cut to 80."""
    con = Console()
    return con if con.is_terminal else Console(width=120)
