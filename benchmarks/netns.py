"""Two "sites" on this machine joined by a real, bandwidth-capped network link, for bench_planner.py.

Each site is a Linux network namespace; a veth pair joins them, and both ends are shaped by tc's token
bucket filter (tbf) to the given rate, so traffic between the sites crosses a real TCP link of that
bandwidth while traffic inside a site stays on the namespace's loopback. This kernel has tbf but no
netem, so added latency still comes from tests/linkemu.py. Needs root and iproute2 (`ip`, `tc`).

    with VethSites(mbit=100) as sites:
        sites.launch(runs, per_site=2, module="benchmarks.planner_worker")
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from pretrain.launch import RunSpec, torchrun_args
from pretrain.planner.cluster import Cluster
from pretrain.planner.measure import MeasureSettings

NAMESPACES = ("pipeline-site0", "pipeline-site1")
DEVICES = ("pveth0", "pveth1")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
PORT = 29517


def unavailable_reason() -> str | None:
    """Why real links cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (iproute2)" if missing else None


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


class VethSites:
    def __init__(self, mbit: float):
        self.mbit = mbit

    def __enter__(self) -> "VethSites":
        self._remove()  # leftovers of a run that was killed
        for ns in NAMESPACES:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", DEVICES[0], "type", "veth", "peer", "name", DEVICES[1])
        rate_Bps = self.mbit * 1e6 / 8
        burst = max(int(rate_Bps / 1000), 64 * 1024)  # 1 ms at the rate, at least a 64 KiB GSO packet
        for ns, dev, addr in zip(NAMESPACES, DEVICES, ADDRESSES):
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")  # a site's own ranks talk over loopback
            _run(
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{self.mbit:g}mbit",
                "burst",
                str(burst),
                "latency",
                "1s",
            )
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    @staticmethod
    def _remove() -> None:
        for ns in NAMESPACES:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def measure_cluster(self, world: int, settings: MeasureSettings, env: dict) -> Cluster:
        """The planner's own measurement (pretrain.planner.measure.measure_rank), its ranks split over the
        two sites, so the link matrix it finds crosses the real link (and the emulated latency in `env`)."""
        per_site = world // 2
        code = (
            "import json, sys; sys.path.insert(0, 'tests'); from linkemu import install_from_env; "
            "from pretrain.planner.measure import measure_rank; "
            "measure_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), "
            "install_from_env)"
        )
        with tempfile.TemporaryDirectory() as tmp:
            store, result = str(Path(tmp) / "store"), Path(tmp) / "cluster.json"
            procs = [
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        NAMESPACES[r // per_site],
                        sys.executable,
                        "-c",
                        code,
                        str(r),
                        str(world),
                        store,
                        str(result),
                        json.dumps(asdict(settings)),
                    ],
                    env={**os.environ, **env, "GLOO_SOCKET_IFNAME": DEVICES[r // per_site]},
                )
                for r in range(world)
            ]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise RuntimeError(f"the cluster measurement across sites failed (exit codes {codes})")
            raw = json.loads(result.read_text())
        raw["source"] = f"measured across two network namespaces joined by a {self.mbit:g} Mbit/s veth link"
        return Cluster.from_dict(raw)

    def launch(self, runs: list[RunSpec], per_site: int, module: str) -> None:
        """One torchrun per site, inside its namespace: ranks 0..per_site-1 on site 0, the rest on site 1.
        The sites inherit this process's environment."""
        spec = json.dumps([asdict(r) for r in runs])
        procs = []
        for k, (ns, dev) in enumerate(zip(NAMESPACES, DEVICES)):
            cmd = [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-m",
                "torch.distributed.run",
                *torchrun_args(per_site, 2, k, ADDRESSES[0], PORT),
                "-m",
                module,
                spec,
            ]
            procs.append(subprocess.Popen(cmd, env={**os.environ, "GLOO_SOCKET_IFNAME": dev}))
        while all(p.poll() is None for p in procs):
            time.sleep(0.2)
        if any(p.poll() not in (None, 0) for p in procs):  # one site failed: the other would wait for it
            for p in procs:
                if p.poll() is None:
                    p.kill()
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"a site's torchrun failed (exit codes {codes})")
