"""Run `pipeline` commands in real processes and SIGKILL each at an exact point: when a given function is called.

A point is MODULE:FUNCTION[:SUFFIX] and a count N: the process is killed on the Nth call of FUNCTION
(looked up in MODULE, e.g. `common.store:Store.publish`) that has a positional argument ending with
SUFFIX (any call, without one), before that call runs. The CLI itself is unchanged: one function is
wrapped, so a test can stop a process inside a transaction or between a rename and the manifest
update, which polling from outside cannot hit.

Importing torch and sentence-transformers takes most of a small command's time, so `Killer` starts one
process that imports them once and forks a child per command (as multiprocessing's fork start method
does): each child is a fresh process running the CLI's code, killed at its point.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def arm(point: str, nth: int, disk_full: bool = False) -> None:
    """Kill this process on the nth call of point, or with `disk_full` make that call fail as a write to a
    full disk does (OSError ENOSPC)."""
    module_name, name, *suffix = point.split(":")
    owner = importlib.import_module(module_name)
    *path, attribute = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, attribute)
    calls = 0

    def killing(*args, **kwargs):
        nonlocal calls
        if not suffix or any(str(a).endswith(suffix[0]) for a in args):
            calls += 1
            if calls == nth and disk_full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), point)
            if calls == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, attribute, killing)


def run_command(point: str, nth: int, args: list[str], log: str) -> None:
    """In a forked child: output to `log`, arm the point, run the CLI, exit with its status."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        arm(point, nth)
        from cli import app

        app(args, prog_name="pipeline")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """Read one request per line, [point, nth, args, log]; answer each with the child's exit status."""
    import faiss  # noqa: F401
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401

    import cli  # noqa: F401 -- what every command imports, once

    print("ready", flush=True)
    for line in sys.stdin:
        point, nth, args, log = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_command(point, nth, args, log)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


class Killer:
    """The forking process, driven from a test."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.process = subprocess.Popen(
            [sys.executable, __file__], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline().strip() == "ready"
        self.runs = 0

    def run(self, point: str, nth: int, *args: str) -> str:
        """Run `pipeline ARGS`, killed on the nth call of point; the kill must happen. Returns its output."""
        self.runs += 1
        log = self.log_dir / f"run{self.runs}.log"
        self.process.stdin.write(json.dumps([point, nth, list(args), str(log)]) + "\n")
        self.process.stdin.flush()
        status = int(self.process.stdout.readline())
        assert status == -signal.SIGKILL, f"{point} was not reached (exit {status}):\n{log.read_text()[-2000:]}"
        return log.read_text()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def armed_process(point: str, nth: int, *args: str, disk_full: bool = False, **popen) -> subprocess.Popen:
    """`pipeline ARGS` started in a process of its own, killed on the nth call of point (or, `disk_full`,
    that call failing as on a full disk): for a command that runs until something reaches it from outside
    (`pipeline serve` and a request)."""
    command = [sys.executable, __file__, "--disk-full" if disk_full else "--armed", point, str(nth), *args]
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, **popen)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if sys.argv[1:2] in (["--armed"], ["--disk-full"]):
        arm(sys.argv[2], int(sys.argv[3]), disk_full=sys.argv[1] == "--disk-full")
        from cli import app

        app(sys.argv[4:], prog_name="pipeline")
    else:
        serve()
