"""One place for user-facing output: results go to stdout, progress and warnings to stderr.

Both consoles print text as it is: no rich markup, emoji codes or highlighting is read into it, so a
document title like "[/b] :warning:" or a file name with brackets comes out verbatim. Styles are given
as rich Text (see warn), never as markup inside a string.
"""

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def quiet_descriptor(fd: int) -> Iterator[None]:
    """Send what C code writes to file descriptor `fd` (1: stdout, 2: stderr) to /dev/null meanwhile: some
    libraries print from C, below Python's streams (FAISS's on-disk lists, Kineto's profiler)."""
    (sys.stdout if fd == 1 else sys.stderr).flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def quiet_stdout():
    """quiet_descriptor(1): stdout holds results (a --json answer), never a library's notice."""
    return quiet_descriptor(1)
