"""One place for user-facing output: results go to stdout, progress and warnings to stderr."""
from rich.console import Console

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", highlight=False, markup=True)


def info(message: str) -> None:
    err.print(message, highlight=False, markup=False)
