"""Where a tuning step's time goes: batching (the data loader collating and tokenizing the next batch), the
model's forward and backward (the loss included), and the optimizer.

The trainer calls `begin` when a step's batch is ready, `before_optimizer` once the gradients are in, and
`end` after the optimizer step. On CUDA each mark is an event recorded on the stream, so the shares are of
the device's own timeline (the gap between one step's end and the next one's begin is the device waiting
for its next batch) and timing stalls nothing; on a CPU the marks are the wall clock.
"""

from __future__ import annotations

import time


class StepClock:
    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.steps: list[list] = []  # per step: [begin, before optimizer, end] marks

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self) -> None:
        self.steps.append([self.mark()])

    def before_optimizer(self) -> None:
        if self.steps and len(self.steps[-1]) == 1:
            self.steps[-1].append(self.mark())

    def end(self) -> None:
        if self.steps and len(self.steps[-1]) == 2:
            self.steps[-1].append(self.mark())

    def seconds(self, start, stop) -> float:
        return start.elapsed_time(stop) / 1000 if self.cuda else stop - start

    def profile(self) -> dict | None:
        """The mean step's seconds and each part's share of it, over the steps after the first (the first
        has no step before it to measure its batching from, and warms up); None with fewer than two."""
        complete = [s for s in self.steps if len(s) == 3]
        if len(complete) < 2:
            return None
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        batching = model = optimizer = 0.0
        for previous, (begin, before_optimizer, end) in zip(complete, complete[1:]):
            batching += self.seconds(previous[2], begin)
            model += self.seconds(begin, before_optimizer)
            optimizer += self.seconds(before_optimizer, end)
        total = batching + model + optimizer
        return {
            "steps_measured": len(complete) - 1,
            "step_s": total / (len(complete) - 1),
            "batching_share": batching / total,
            "forward_backward_share": model / total,
            "optimizer_share": optimizer / total,
        }
