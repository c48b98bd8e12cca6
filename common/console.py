"""One place for user-facing output: results go to stdout, progress and warnings to stderr.

Both consoles print text as it is: no rich markup, emoji codes or highlighting is read into it, so a
document title like "[/b] :warning:" or a file name with brackets comes out verbatim. Styles are given
as rich Text (see warn), never as markup inside a string.
"""

import logging
import warnings

from rich.console import Console
from rich.text import Text

out = Console(soft_wrap=True, markup=False, emoji=False, highlight=False)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False, highlight=False)


def warn(message: str) -> None:
    err.print(Text.assemble(("warning:", "yellow"), " ", message))


def info(message: str) -> None:
    err.print(message)


def quiet_libraries() -> None:
    """Keep the libraries' own notices from the user (our messages say what matters): workflows.py calls
    this when imported (the Python API), the CLI before every command. Their progress bars are off through
    common/__init__.py's environment."""
    # torch.distributed.checkpoint saving or loading in a single process: that is what we mean it to do.
    warnings.filterwarnings(
        "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
    )
    # sentence-transformers' trainer: the no-duplicates batch sampler's notice that a small corpus repeats pairs.
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
