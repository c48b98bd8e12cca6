"""One place for user-facing output: results go to stdout, progress and warnings to stderr.

Both consoles print text as it is: no rich markup, emoji codes or highlighting is read into it, so a
document title like "[/b] :warning:" or a file name with brackets comes out verbatim. Styles are given
as rich Text (see warn), never as markup inside a string.
"""
from rich.console import Console
from rich.text import Text

out = Console(soft_wrap=True, markup=False, emoji=False, highlight=False)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False, highlight=False)


def warn(message: str) -> None:
    err.print(Text.assemble(("warning:", "yellow"), " ", message))


def info(message: str) -> None:
    err.print(message)
