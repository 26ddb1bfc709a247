"""What every dyncli command shares: the two Rich consoles, the exit statuses, `fail` (one line
on stderr, then exit) and the `--debug` switch. Command modules import it; it imports no
command module.

Exit statuses: 0 ok, 1 a check or expectation failed, 2 usage or input error, 130 interrupted.
"""
from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

console = Console()
err_console = Console(stderr=True)
# set by the app's callback from --debug: tracebacks instead of one-line errors
state = {"debug": False}


def fail(msg: str, code: int = EXIT_USAGE):
    """Print 'error: MSG' on stderr and exit with `code`. MSG is plain text: brackets in it
    (dyncli[check], name[1,8], a node's name) are printed as written, not read as Rich markup."""
    err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_wide(renderable, width: int) -> None:
    """Print at `width` columns even past the terminal's (a terminal wraps the lines; `--wide`
    asked for every column whole). Console.print's own width cannot exceed the console's."""
    Console(width=max(width, console.width), highlight=False).print(renderable, crop=False)


def warn(msg: str) -> None:
    """'warning: MSG' on stderr, one line (MSG plain text, as for `fail`)."""
    err_console.print(f"[yellow]warning:[/] {escape(msg)}", highlight=False, soft_wrap=True)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` for the CLI: the message alone, as `warn` prints it (Python's
    format adds the source line and path: noise to a user)."""
    warn(str(message))
