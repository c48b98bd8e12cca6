"""Connecting to Ray, for the stages that can run on a Ray cluster (pretrain, embed, index and serve --ray).

local      a throw-away Ray cluster on this machine (for trying things out and for tests)
auto       the cluster this machine belongs to (after `ray start --head` / `ray start --address ...`)
HOST:PORT  a cluster's head node, e.g. ray://10.0.0.5:10001 or 10.0.0.5:6379
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from common.console import stderr_without, warn
from common.errors import PipelineError

INSTALL_HINT = "Ray is not installed: pip install 'embedding-pipeline[ray]' (or: pip install 'ray[train,data,serve]')"


def import_ray():
    try:
        import ray
    except ImportError:
        raise PipelineError(INSTALL_HINT) from None
    return ray


def connect(address: str, num_cpus: int | None = None):
    """Start or join a Ray cluster; returns the ray module. Reuses a connection already open.

    The workers' output stays in Ray's log directory (its session's logs/), never shown here: most of it is
    Ray's own (its Train controller's notices, health checks, a surviving worker's traceback when a peer dies),
    each line prefixed with the actor's name. What a stage's workers have to tell the user reaches it through
    the stage itself (pretraining's rank 0: pretrain/ray_train.py)."""
    if address == "local":
        # Ray starts a local cluster with token authentication, and says so unless the mode is chosen: chosen.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    ray = import_ray()
    if ray.is_initialized():
        return ray
    # Joining a cluster found on this machine (auto) where a token exists, Ray turns token authentication on, as
    # the cluster needs, and says so in a notice for each command: the mode is not the user's to choose there.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    runtime_env = worker_environment()
    try:
        if address == "local":  # a new instance on this machine, even where another one runs (ray's "local")
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                runtime_env=runtime_env,
                configure_logging=False,
            )
        else:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise PipelineError(f"--ray {address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]})") from None
    return ray


@contextlib.contextmanager
def notices_on_stderr() -> Iterator[None]:
    """While Ray works for a command: what Ray's driver prints on stdout (its "(raylet) ..." notice of a worker or
    actor that died: one coloured line of some 1,300 characters) becomes a one-sentence warning on stderr, so
    stdout keeps only the command's result (--json). What the driver's C++ core worker logs on stderr stays in
    its log file (the session's logs/python-core-driver-*.log), where it also goes: e.g. that Ray Data's actors,
    whose constructor arguments are in the object store, might not restart (ray-project/ray#53727), a notice
    for Ray's developers that every `embed --ray` would print."""
    with contextlib.redirect_stdout(RayNotices()), stderr_without(RAY_NATIVE_LOG_LINE, starting=b"["):
        yield


# A line of Ray's C++ log: "[2026-11-29 15:42:24,505 E 24877 24877] core_worker.cc:2465: ..."
RAY_NATIVE_LOG_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z] \d+ \d+\] \S+:\d+: ")


class RayNotices:
    """A stand-in for stdout: each line written becomes `warning: Ray: <its first sentence>.` on stderr."""

    COLOUR = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self):
        self.partial = ""

    def write(self, text: str) -> int:
        *complete, self.partial = (self.partial + text).split("\n")
        for line in complete:
            notice = self.COLOUR.sub("", line).removeprefix("(raylet) ").strip()
            if notice:
                warn(f"Ray: {notice.split('. ')[0].rstrip('.')}.")
        return len(text)

    def flush(self) -> None:
        pass


def worker_environment() -> dict | None:
    """Ray's runtime_env for the workers, which import this project by module name. Where the project is installed
    in this Python (as `scripts/setup.sh` installs it, editable), they import it as this process does and need
    none: a runtime_env makes Ray start every worker twice (a setup process, then the worker;
    benchmarks/results/2026-11-29-test-suite-cpu.md). Otherwise (run from a source tree) the repository goes on
    their PYTHONPATH."""
    repo = Path(__file__).resolve().parent.parent
    if installed_from(repo):
        return None
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}}


def installed_from(repo: Path) -> bool:
    """Whether this Python's installed embedding-pipeline is this checkout (an editable install of it), or this
    code is itself the installed copy (then no pyproject.toml sits above it)."""
    # Every copy Python finds (a source tree's own egg-info may come first on sys.path).
    for found in importlib.metadata.distributions(name="embedding-pipeline"):
        origin = json.loads(found.read_text("direct_url.json") or "{}").get("url", "")
        if origin == repo.as_uri() or not (repo / "pyproject.toml").exists():
            return True
    return False
