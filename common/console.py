"""One place for user-facing output: results go to stdout, progress and warnings to stderr.

Both consoles print text as it is: no rich markup, emoji codes or highlighting is read into it, so a
document title like "[/b] :warning:" or a file name with brackets comes out verbatim. Styles are given
as rich Text (see warn), never as markup inside a string. Control characters in what they print (a
document's title, id or snippet, a file name in an error) are shown, never sent: see `visible`.
"""

import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text

# C0 controls but tab and newline, DEL and C1 controls: what a terminal may act on (ESC starts an escape
# sequence that can clear the screen or set the window's title; U+009B is a one-character CSI). Each is
# shown as one character, its Unicode control picture (or U+FFFD for C1), so styled spans keep their places.
CONTROL_PICTURES = (
    {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
    | {0x7F: 0x2421}
    | dict.fromkeys(range(0x80, 0xA0), 0xFFFD)
)


def visible(text: str) -> str:
    """`text` with every control character a terminal could act on replaced by a visible stand-in."""
    return text.translate(CONTROL_PICTURES)


def visible_json(text: str) -> str:
    """JSON text (json.dumps(..., ensure_ascii=False)) with C1 controls escaped as JSON allows (\\u0080):
    json.dumps escapes C0 controls itself, and the value read back is unchanged."""
    return text.translate({c: f"\\u{c:04x}" for c in range(0x80, 0xA0)})


class VisibleConsole(Console):
    """A rich Console whose printed strings and Text have their control characters made visible; tables
    are built from visible() cells by their makers."""

    def print(self, *objects, **kwargs) -> None:
        super().print(*(_visible_renderable(o) for o in objects), **kwargs)


def _visible_renderable(renderable):
    if isinstance(renderable, str):
        return visible(renderable)
    if isinstance(renderable, Text):
        shown = renderable.copy()
        shown.plain = visible(renderable.plain)  # the same length: spans keep their places
        return shown
    return renderable


out = VisibleConsole(soft_wrap=True, markup=False, emoji=False, highlight=False)
err = VisibleConsole(stderr=True, soft_wrap=True, markup=False, emoji=False, highlight=False)


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


@contextmanager
def stderr_without(lines: re.Pattern[bytes], starting: bytes) -> Iterator[None]:
    """Meanwhile, lines written to file descriptor 2 (by C code or by Python, whichever stream object wrote
    them) that match `lines` are dropped, and the rest pass as they come: for a library whose C++ core logs
    to stderr as well as to its own log files (Ray's core worker in this process). A pipe takes the
    descriptor's place and a thread forwards what it reads; an unfinished line waits for its newline only if
    it begins with `starting`, as the dropped lines do."""
    try:
        terminal = os.dup(2)
    except OSError:  # no stderr (closed by the caller): nothing to keep clean
        yield
        return
    flush_stderr()
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarding = threading.Thread(target=forward_lines, args=(read_end, terminal, lines, starting), daemon=True)
    forwarding.start()
    try:
        yield
    finally:
        flush_stderr()
        os.dup2(terminal, 2)  # the pipe's write end closes with it: the thread reads to the end, then stops
        forwarding.join(timeout=5)


def forward_lines(read_end: int, terminal: int, dropped: re.Pattern[bytes], starting: bytes) -> None:
    """stderr_without's thread: copies the pipe to the terminal's descriptor but the dropped lines, then closes both."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *complete, pending = (pending + chunk).split(b"\n")
            shown = b"".join(line + b"\n" for line in complete if not dropped.match(line))
            if pending and not pending.startswith(starting[: len(pending)]):  # no dropped line: shown now
                shown, pending = shown + pending, b""
            write_all(terminal, shown)
        if not dropped.match(pending):
            write_all(terminal, pending)
    os.close(terminal)


def flush_stderr() -> None:
    if sys.stderr is not None:  # None where Python started without a stderr
        sys.stderr.flush()


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def quiet_stdout():
    """quiet_descriptor(1): stdout holds results (a --json answer), never a library's notice."""
    return quiet_descriptor(1)
