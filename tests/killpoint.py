"""Run the `pipeline` CLI and SIGKILL it at an exact point of its work: when a given function is called.

    python tests/killpoint.py MODULE:FUNCTION[:SUFFIX] N -- PIPELINE ARGUMENTS...

kills the process on the Nth call of FUNCTION (looked up in MODULE, e.g. `common.store:Store.publish`)
that has a positional argument ending with SUFFIX (any call without one), before the call runs. The
CLI itself is unchanged: this only wraps one function, so a test can stop a real process in the middle
of a transaction or between a rename and the manifest update, which polling from outside cannot hit.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def arm(target: str, nth: int) -> None:
    module_name, name, *suffix = target.split(":")
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
            if calls == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, attribute, killing)


if __name__ == "__main__":
    target, nth, separator, *cli_args = sys.argv[1:]
    assert separator == "--", __doc__
    arm(target, int(nth))
    from cli import app

    app(cli_args, prog_name="pipeline")
