"""Placement: which device each coordinate of a plan's mesh runs on, the groups each dimension forms,
and the slowest link those groups' collectives and the pipeline's sends cross."""

from __future__ import annotations

import itertools
from collections import Counter

from pretrain.config import ParallelConfig
from pretrain.planner.cluster import Cluster, Link, ring_hops


class Layout:
    """Where each mesh coordinate runs: global ranks in torchrun order under a node order."""

    def __init__(self, config: ParallelConfig, cluster: Cluster, node_order: tuple[int, ...]):
        self.c, self.cluster = config, cluster
        order = node_order or tuple(range(len(cluster.nodes)))
        # devices in job-rank order: nodes in `order`, each node's devices consecutively
        self.device_of_rank = [i for k in order for i, d in enumerate(cluster.devices) if d.node == k]
        self.shape = (config.pp, config.dp_replicate, config.dp_shard, config.tp)

    def rank(self, pp: int, rep: int, shard: int, tp: int) -> int:
        _, r, s, t = self.shape
        return ((pp * r + rep) * s + shard) * t + tp

    def device(self, rank: int):
        return self.cluster.devices[self.device_of_rank[rank]]

    def coords(self):
        return itertools.product(*(range(n) for n in self.shape))

    def group(self, dim: str, coord: tuple[int, int, int, int]) -> list[int]:
        """The device indices of the group along `dim` through `coord`."""
        i = ("pp", "dp_replicate", "dp_shard", "tp").index(dim)
        ranks = []
        for k in range(self.shape[i]):
            c = list(coord)
            c[i] = k
            ranks.append(self.device_of_rank[self.rank(*c)])
        return ranks

    def slowest_ring(self, dim: str) -> tuple[Link, int]:
        """The slowest ring hop over all groups along `dim` (they run their collectives at the same time),
        and the group size."""
        groups = list({tuple(self.group(dim, c)): None for c in self.coords()})
        hops = [hop for g in groups for hop in ring_hops(list(g))]
        return (self._concurrent(hops) if hops else Link(0.0, float("inf"))), len(groups[0])

    def pp_link(self, a: int, b: int) -> Link:
        """The slowest link between pipeline ranks a and b over all their dp/tp coordinates (every
        replica sends at the same time)."""
        return self._concurrent(
            [
                (self.device_of_rank[self.rank(a, r, s, t)], self.device_of_rank[self.rank(b, r, s, t)])
                for p, r, s, t in self.coords()
                if p == 0
            ]
        )

    def _concurrent(self, hops: list[tuple[int, int]]) -> Link:
        """The slowest of device-to-device sends made at the same time. Where the cluster's links are
        shared (a real network), the sends crossing between the same two nodes in the same direction
        split that link's bandwidth."""
        node = lambda d: self.cluster.devices[d].node  # noqa: E731
        flows = (
            Counter((node(a), node(b)) for a, b in hops if node(a) != node(b))
            if self.cluster.shared_links
            else Counter()
        )
        links = [self.cluster.link(a, b) for a, b in hops]
        return Link(
            max(link.latency_s for link in links),
            min(link.bandwidth_Bps / max(1, flows[(node(a), node(b))]) for link, (a, b) in zip(links, hops)),
        )

    def stage_devices(self, p: int) -> list:
        return [self.device(self.rank(p, r, s, t)) for _, r, s, t in self.coords() if _ == 0]
