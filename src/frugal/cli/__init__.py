"""The `frugal` command line: thin commands that parse, call the library and print."""

ARGV: list[str] = []  # the running command's arguments (`frugal train` relaunches them)
