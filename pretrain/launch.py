"""Starting a training job of several processes.

The parent (`pipeline pretrain --nproc N`) prepares the data, then launch() re-executes this module
through torch.distributed.run, the code behind the `torchrun` command, on this node. Each worker
joins the process group and calls train() for every run of the spec it was given (one for the CLI;
tests and benchmarks pass several plans to pay for the start-up once).

Failures: the elastic agent runs with max_restarts=0, so when a worker raises or is killed it
stops the other workers (which may be blocked in a collective) and launch() raises a one-line
PipelineError naming the rank that failed first. The process-group timeout (--dist-timeout) bounds
the wait of a worker whose peer hangs without dying.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.errors import PipelineError

# Messages of ranks that failed only because a peer died first.
_PEER_FAILURE_HINTS = (
    "connection closed",
    "connection reset",
    "broken pipe",
    "distbackenderror",
    "distnetworkerror",
    "gloo",
    "nccl",
    "timed out",
    "timeout",
    "socket",
)


@dataclass
class RunSpec:
    workspace: str
    train: dict  # dataclasses.asdict(TrainConfig)
    plan: dict  # dataclasses.asdict(ParallelConfig)
    resume_from: str | None = None
    export: bool = True
    prediction: dict | None = None  # the planner's, logged beside what the run measures
    options: dict = field(default_factory=dict)  # dataclasses.asdict(RuntimeOptions); {} = the defaults


def torchrun_args(
    nproc: int, nnodes: int = 1, node_rank: int = 0, master_addr: str | None = None, master_port: int | None = None
) -> list[str]:
    args = [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", "--max-restarts=0", "--monitor-interval=0.1"]
    if nnodes == 1 and master_addr is None and master_port is None:
        args.append("--standalone")  # rendezvous on localhost, on a free port
    else:
        args += [
            f"--node-rank={node_rank}",
            f"--master-addr={master_addr or '127.0.0.1'}",
            f"--master-port={master_port or 29500}",
        ]
    return args


def launch(
    runs: list[RunSpec],
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    module: str = "pretrain.launch",
) -> None:
    """Run `runs` in nproc worker processes on this node (nproc × nnodes in the job); raise PipelineError if any fails.

    `module` is the workers' entry point (python -m module SPEC_JSON): this one, unless a test wraps it.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = torchrun_args(nproc, nnodes, node_rank, master_addr, master_port)
    args += ["-m", module, json.dumps([asdict(r) for r in runs])]
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        raise PipelineError(f"training failed: {failure_summary(e.failures)}") from None
    except SignalException as e:  # Ctrl-C or a kill of this process: the agent has stopped the workers
        raise PipelineError(f"training interrupted by {signal.Signals(e.sigval).name}; workers stopped") from None


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() or 1


def failure_summary(failures: dict) -> str:
    """One line naming the root cause among the failed ranks: ranks that died because a peer died
    (connection errors, the agent's SIGTERM) are passed over for the one that failed on its own."""

    def message(f) -> str:
        text = f.message.get("message", "") if isinstance(f.message, dict) else str(f.message or "")
        return text.strip().splitlines()[-1] if text.strip() else ""

    def secondary(f) -> bool:
        return f.exitcode == -signal.SIGTERM or any(h in message(f).lower() for h in _PEER_FAILURE_HINTS)

    rank, failure = min(failures.items(), key=lambda item: (secondary(item[1]), item[1].timestamp, item[0]))
    # The exception a rank recorded is the cause even if the process then died by a signal: a rank that
    # raised can still abort in teardown ("terminate called without an active exception" from a
    # communication thread), which would otherwise hide what it raised.
    # (A rank killed outright has only the agent's "Signal 9 (SIGKILL) received by PID ..." as its message.)
    raised = bool(failure.error_file_data) and bool(message(failure)) and not message(failure).startswith("Signal ")
    if raised:
        cause = f"rank {rank} raised {message(failure)}"
    elif failure.exitcode < 0:
        cause = f"rank {rank} was killed by {failure.signal_name()}"
    else:
        cause = f"rank {rank} exited with code {failure.exitcode}"
    others = len(failures) - 1
    return cause + (f" ({others} other rank{'s' if others > 1 else ''} failed after it)" if others else "")


def whole_file_error_handler():
    """torchelastic's error handler, writing the error file whole or not at all.

    When one rank dies the agent SIGTERMs the others, which may be writing the exception they just
    raised (the collective failed). Torch writes that file in place, so a rank stopped mid-write left
    truncated JSON, and the agent itself crashed parsing it (JSONDecodeError) instead of reporting
    the failure. A rank stopped before its rename leaves no file: the agent then reports the signal.
    """
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    from common.workspace import atomic_write_json

    class WholeFileErrorHandler(ErrorHandler):
        def record_exception(self, e: BaseException) -> None:
            file = self._get_error_file_path()
            if not file:
                return
            message = {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))},
            }
            atomic_write_json(Path(file), {"message": message})

    return WholeFileErrorHandler()


def worker(spec_json: str) -> None:
    import torch.distributed as dist

    from common.workspace import Workspace
    from pretrain.config import ParallelConfig, RuntimeOptions, train_config_from_dict
    from pretrain.train import train

    try:
        for run in json.loads(spec_json):
            train(
                Workspace(Path(run["workspace"])),
                train_config_from_dict(run["train"]),
                resume_from=Path(run["resume_from"]) if run["resume_from"] else None,
                plan=ParallelConfig(**run["plan"]),
                options=RuntimeOptions(**run["options"]),
                export=run["export"],
                prediction=run["prediction"],
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: the exception reaches the agent, and so the parent's message
    record(worker, whole_file_error_handler())(sys.argv[1])
