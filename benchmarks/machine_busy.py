"""How busy the whole machine is, from /proc/stat: every process counts (Ray's and torchrun's too, which
/usr/bin/time does not see). Run a command under it for its wall time and the cores busy meanwhile:

    python3 benchmarks/machine_busy.py bash scripts/test.sh -q

The standard library only: it runs before setup has made .venv. suite_timeline.py reads the same counter."""

from __future__ import annotations

import os
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the machine has spent on anything but idling and waiting for I/O, since boot."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


def main(command: list[str]) -> int:
    started, busy = time.monotonic(), machine_busy_seconds()
    status = subprocess.call(command)
    wall, cpu = time.monotonic() - started, machine_busy_seconds() - busy
    print(f"wall {wall:.1f} s, busy cores {cpu / wall:.2f}, machine CPU {cpu:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
