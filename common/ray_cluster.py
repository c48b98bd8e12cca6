"""Connecting to Ray, for the stages that can run on a Ray cluster (pretrain --ray, embed --ray).

local      a throw-away Ray cluster on this machine (for trying things out and for tests)
auto       the cluster this machine belongs to (after `ray start --head` / `ray start --address ...`)
HOST:PORT  a cluster's head node, e.g. ray://10.0.0.5:10001 or 10.0.0.5:6379
"""

from __future__ import annotations

import os

from common.errors import PipelineError

INSTALL_HINT = "Ray is not installed: pip install 'embedding-pipeline[ray]' (or: pip install 'ray[train,data,serve]')"


def import_ray():
    try:
        import ray
    except ImportError:
        raise PipelineError(INSTALL_HINT) from None
    return ray


def connect(address: str, num_cpus: int | None = None, log_to_driver: bool = True):
    """Start or join a Ray cluster; returns the ray module. Reuses a connection already open. log_to_driver:
    whether the workers' output is shown here (else it stays in Ray's log directory)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    # Workers import this project by module name: make the repository importable on them.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}}
    try:
        if address == "local":  # a new instance on this machine, even where another one runs (ray's "local")
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=False,
                log_to_driver=log_to_driver,
                runtime_env=runtime_env,
                configure_logging=False,
            )
        else:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=log_to_driver, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise PipelineError(f"--ray {address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]})") from None
    return ray
