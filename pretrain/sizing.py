"""How big a model, and how many tokens, for this corpus on this machine in the time the user gives.

A fixed step count suits one corpus and one machine. Instead, for each GPT-2 shape of a ladder, a few
real training steps are timed on this machine; that gives the tokens the shape can train on within the
time budget, at most MAX_EPOCHS passes over the corpus, and a data-constrained scaling law ranks the
shapes by the loss it predicts for each:

    L(N, D) = E + A / N'^alpha + B / D'^beta          Chinchilla (Hoffmann et al. 2022, approach 3), with
    D' = U + U R*_D (1 - exp(-(D / U - 1) / R*_D))    repeated data and excess parameters discounted
    N' = U_N + U_N R*_N (1 - exp(-(N / U_N - 1) / R*_N))   (Muennighoff et al. 2023, "Scaling
                                                      Data-Constrained Language Models")

with N the model's parameters, D the tokens trained on, U the corpus's unique training tokens and U_N
the parameters compute-optimal for U tokens (by the same law). A few epochs are worth almost as much as
new data, more decay in value (R*_D = 15.4); parameters beyond what the unique tokens can fill decay
faster (R*_N = 5.3). So a longer budget or a faster machine (a GPU) buys a larger model only while the
data can use one, never ever more epochs: past MAX_EPOCHS repeats stop paying (on one H100, SciFact's
1.7M tokens for 23 epochs left the validation loss at 6.06 against 4.92 at its best, 10 epochs earlier),
and a run whose budget is more than the data can use is planned shorter, and says so. The ladder is
walked from the smallest shape and stops once the predicted loss stops falling (a larger shape must gain
LAW_GAIN, or it is not worth its cost) or a shape could not take MIN_STEPS steps.

The law ranks; it does not forecast. Its constants were fitted on models of 70M-16B parameters trained on
MassiveText with a 32k-token vocabulary; the shapes here have 0.1-20M parameters, the corpus and the
vocabulary are the user's. Two orders of magnitude below its range its absolute values are far off: on
SciFact it gave 11.0-13.6 nats per token, more than a uniform guess over the vocabulary (ln 4096 = 8.3),
for shapes that reached a validation loss of 4-5. What the choice needs is its ordering (more parameters
learn more from a token, more tokens teach more, repeated tokens and unfilled parameters teach less), and
that is all the sizing table prints: each shape's rank (1 = the lowest loss the law predicts). Fitting the
law's five constants to this machine instead would need each shape's loss at several token counts, reached
by real training: the ladder's timing runs are 4 steps on random tokens, which say how long a step takes
and nothing about where a shape's loss ends. The run's log keeps the law's value for the chosen shape
beside the validation loss the run reached (metrics.jsonl's "sizing" and "end" records, the manifest's
model.prediction.sizing), so the gap stays on record.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch

from common.errors import PipelineError
from pretrain.config import ModelConfig
from pretrain.model import GPT, lm_loss

# Chinchilla's fitted constants (approach 3) and Muennighoff et al.'s for repeated tokens.
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28
REPEAT_HALF_LIFE = 15.4  # R*_D: epochs after which extra repetitions are worth 1/e of new data
EXCESS_PARAMETERS_HALF_LIFE = 5.3  # R*_N: the same for parameters beyond the compute-optimal ones for U tokens
MAX_EPOCHS = 4.0  # passes over the corpus a sized run makes at most (--max-steps/--tokens may ask for more)
LAW_GAIN = 0.01  # nats a larger shape must be predicted to gain over the best smaller one to be chosen
MIN_STEPS = 100  # a shape that can't take this many steps in the budget is too big for it
# The share of the budget left after sizing that goes to training steps: the loop's validation, logging,
# checkpoints and export take the rest (the loop's steps, validation included, took longer than the best bare
# step timed here, and pretraining overran its budget without this share; measured:
# benchmarks/results/2026-11-28-design-measurements-cpu.md).
STEP_SHARE = 0.8


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int
    batch_size: int  # sequences per step
    lr: float


# GPT-2 shapes from 0.1M to 774M non-embedding parameters; wider models take smaller learning rates.
LADDER = (
    Shape(2, 64, 2, 128, 32, 3e-3),
    Shape(4, 128, 4, 128, 32, 2e-3),
    Shape(6, 192, 6, 128, 32, 1.5e-3),
    Shape(6, 256, 8, 256, 32, 1e-3),
    Shape(8, 384, 6, 256, 32, 1e-3),
    Shape(8, 512, 8, 512, 32, 8e-4),
    Shape(12, 768, 12, 1024, 64, 6e-4),  # GPT-2 small
    Shape(24, 1024, 16, 1024, 64, 3e-4),  # GPT-2 medium
    Shape(36, 1280, 20, 1024, 64, 2.5e-4),  # GPT-2 large
)


@dataclass
class Candidate:
    shape: Shape
    parameters: int
    step_s: float
    steps: int
    tokens: int
    epochs: float
    law_loss: float  # the law's L(N, D): for ranking shapes only (module docstring)
    capped: bool = False  # its steps were cut to MAX_EPOCHS: the budget is more than the data can use


def law_loss(parameters: int, tokens: int, unique_tokens: int) -> float:
    """The law's L(N', D') (module docstring): comparable between shapes, not a loss a run reaches."""
    unique_tokens = max(unique_tokens, 1)
    data = repeated_value(tokens, unique_tokens, REPEAT_HALF_LIFE)
    fillable = min(optimal_parameters(unique_tokens), parameters)
    model = repeated_value(parameters, fillable, EXCESS_PARAMETERS_HALF_LIFE)
    return E + A / max(model, 1) ** ALPHA + B / max(data, 1) ** BETA


def repeated_value(amount: float, unique: float, half_life: float) -> float:
    """What `amount` is worth when only `unique` of it is new: all of it up to `unique`, then each further
    `unique` worth less (Muennighoff et al.'s exponential decay with R* = half_life)."""
    if amount <= unique:
        return amount
    return unique * (1 + half_life * (1 - math.exp(-(amount / unique - 1) / half_life)))


def optimal_parameters(tokens: float) -> float:
    """U_N: the parameters the law makes compute-optimal for `tokens` (Chinchilla's N_opt(C) at the compute
    C whose optimal tokens are `tokens`)."""
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    compute_over_6 = (tokens * g) ** ((ALPHA + BETA) / ALPHA)
    return g * compute_over_6 ** (BETA / (ALPHA + BETA))


def epoch_steps(unique_tokens: int, tokens_per_step: int, max_epochs: float = MAX_EPOCHS) -> int:
    """The steps that pass over the corpus `max_epochs` times."""
    return max(1, int(max_epochs * unique_tokens / tokens_per_step))


def time_step(shape: Shape, vocab_size: int, device: torch.device, repeats: int = 3) -> tuple[int, float]:
    """(parameters, seconds per optimizer step) of this shape on this device: one warm-up step, then the
    median of `repeats` (as training runs them: forward, backward, clipping, AdamW)."""
    cfg = ModelConfig(
        vocab_size=vocab_size, n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd, block_size=shape.seq_len
    )
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=shape.lr)
    tokens = torch.randint(0, vocab_size, (shape.batch_size, shape.seq_len + 1), device=device)
    seconds = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:  # the first step allocates and warms up
            seconds.append(time.perf_counter() - start)
    return model.num_params(), statistics.median(seconds)


def choose_shape(
    unique_tokens: int,
    vocab_size: int,
    seconds: float,
    device: torch.device,
    processes: int = 1,
    ladder: tuple[Shape, ...] = LADDER,
    timer=time_step,
) -> tuple[Candidate, list[Candidate]]:
    """The ladder shape with the lowest loss the law predicts within `seconds` of training, and every shape measured.
    `processes` data-parallel processes take that many times the tokens per second of one."""
    measured: list[Candidate] = []
    candidate = None
    for shape in ladder:
        try:
            parameters, step_s = timer(shape, vocab_size, device)
        except torch.OutOfMemoryError:  # a shape whose batch does not fit the device: larger ones won't either
            if device.type == "cuda":
                torch.cuda.empty_cache()
            break
        fit = max(1, int(seconds * processes / step_s))
        steps = min(fit, epoch_steps(unique_tokens, shape.batch_size * shape.seq_len))
        tokens = steps * shape.batch_size * shape.seq_len
        candidate = Candidate(
            shape,
            parameters,
            step_s,
            steps,
            tokens,
            tokens / max(unique_tokens, 1),
            law_loss(parameters, tokens, unique_tokens),
            capped=steps < fit,
        )
        if steps < MIN_STEPS:
            break
        measured.append(candidate)
        if len(measured) > 1 and candidate.law_loss > min(c.law_loss for c in measured[:-1]) - LAW_GAIN:
            break
    if not measured:  # even the smallest shape is slow here (or too big): take it, with as many steps as fit
        if candidate is None:
            raise PipelineError(
                f"the smallest model shape does not fit on {device.type}: "
                "give --preset, or a shape with --n-layer/--n-embd and a --batch-size"
            )
        measured.append(candidate)
    best = measured[0]  # a larger shape only where it is predicted to gain LAW_GAIN over the best smaller one
    for c in measured[1:]:
        if c.law_loss < best.law_loss - LAW_GAIN:
            best = c
    return best, measured


def vocab_for(corpus_chars: int) -> int:
    """A vocabulary that grows with the corpus: more whole words for larger ones, not so many that rare
    tokens go untrained on small ones (about 1 token type per 1,000 characters, 4,096 to 32,768)."""
    return 1 << max(12, min(15, round(math.log2(max(corpus_chars, 1) / 1000))))


def apply_shape(cfg, shape: Shape, steps: int):
    cfg.model = ModelConfig(
        vocab_size=cfg.vocab_size,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        n_embd=shape.n_embd,
        block_size=max(256, shape.seq_len),
    )  # embedders read chunks of up to 256 tokens
    cfg.seq_len, cfg.batch_size, cfg.lr, cfg.max_steps = shape.seq_len, shape.batch_size, shape.lr, steps
    return cfg


def size_to_budget(cfg, unique_tokens: int, seconds: float, processes: int = 1, plan=None, timer=time_step) -> tuple:
    """Set cfg's model shape, sequence length, batch, learning rate and steps to the ladder shape the scaling law
    ranks first for `seconds` of training (among those `plan` accepts); returns (cfg, report lines, the
    record the run's log keeps: every shape timed, its rank and the law's value)."""
    started = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ladder = tuple(
        shape for shape in LADDER if plan is None or _accepts(plan, apply_shape(copy.deepcopy(cfg), shape, 1))
    )
    if not ladder:
        raise PipelineError(
            "no model shape of the sizing ladder fits this parallel plan: give --preset or --n-layer/--n-head/--n-embd"
        )
    with OtherLoad() as load:
        best, measured = choose_shape(
            unique_tokens, cfg.vocab_size, STEP_SHARE * seconds, device, processes, ladder, timer
        )
    shape = best.shape
    # the steps that fit in what sizing itself left of the budget
    step_seconds = STEP_SHARE * max(seconds - (time.monotonic() - started), 0.0)
    steps = max(1, min(best.steps, int(step_seconds * processes / best.step_s)))
    tokens = steps * shape.batch_size * shape.seq_len
    capped = steps == epoch_steps(unique_tokens, shape.batch_size * shape.seq_len)
    chosen = replace(
        best,
        steps=steps,
        tokens=tokens,
        epochs=tokens / max(unique_tokens, 1),
        law_loss=law_loss(best.parameters, tokens, unique_tokens),
    )
    cfg = apply_shape(cfg, shape, chosen.steps)
    # the loop times whole steps, all processes together, and re-plans within this time and MAX_EPOCHS
    cfg.step_budget_s = step_seconds
    cfg.max_planned_steps = epoch_steps(unique_tokens, shape.batch_size * shape.seq_len)
    ranks = {id(c): rank for rank, c in enumerate(sorted(measured, key=lambda c: c.law_loss), 1)}  # as decided
    shown = [(chosen if c is best else c, ranks[id(c)], c is best) for c in measured]
    lines = [
        f"sizing for {seconds / 60:.1f} min of pretraining on {device.type} ({processes} process(es)), "
        f"{STEP_SHARE:.0%} of it for training steps, the rest for validation, checkpoints and export; "
        f"{unique_tokens:,} unique training tokens; each shape timed on this machine and ranked by the scaling law "
        "(1 = the lowest loss it predicts: a ranking, not a forecast; its constants were fitted on models of "
        "70M-16B parameters and its losses do not hold for these):"
    ]
    for c, rank, is_chosen in shown:
        lines.append(
            f"{'->' if is_chosen else '  '} rank {rank}  {c.shape.n_layer:2d} layers d={c.shape.n_embd:<4d} "
            f"{c.parameters / 1e6:7.2f}M params  {c.step_s * 1000:7.0f} ms/step  {c.steps:6,d} steps  "
            f"{c.tokens / 1e6:7.1f}M tokens ({c.epochs:5.1f} epochs)"
        )
    lines.append(
        f"chosen: {shape.n_layer} layers, d={shape.n_embd}, "
        f"{chosen.steps:,} steps of {shape.batch_size}x{shape.seq_len} tokens "
        f"({chosen.epochs:.1f} epochs): ranked first by the scaling law in the budget "
        "(larger shapes see too few tokens or more parameters than the data can fill, smaller ones learn less "
        "per token)"
    )
    if capped:
        lines.append(
            f"the budget is more than these {unique_tokens:,} tokens can use: training stops at {MAX_EPOCHS:g} "
            f"epochs (repeats stop paying), about {steps * best.step_s / processes:.0f}s of the "
            f"{step_seconds:.0f}s planned for steps; the rest is not spent"
        )
    if device.type == "cpu" and load.share >= BUSY_SHARE:
        lines.append(
            f"note: other processes used {load.share:.0%} of this machine's cores while the shapes were timed, so "
            "they were timed slower than this machine runs them: on a quiet machine a larger shape may be chosen"
        )
    record = {
        "budget_s": seconds,
        "device": device.type,
        "processes": processes,
        "unique_tokens": unique_tokens,
        "max_epochs": MAX_EPOCHS,
        "capped_at_max_epochs": capped,
        "other_load": load.share,
        "shapes": [
            {
                **asdict(c.shape),
                "parameters": c.parameters,
                "step_s": c.step_s,
                "steps": c.steps,
                "tokens": c.tokens,
                "epochs": c.epochs,
                "capped_at_max_epochs": c.capped,
                "law_rank": rank,
                "law_loss": c.law_loss,  # Chinchilla's value, far from what the run reaches: for ranking only
                "chosen": is_chosen,
            }
            for c, rank, is_chosen in shown
        ],
    }
    return cfg, lines, record


BUSY_SHARE = 0.25  # other processes' share of the cores during the timing that makes the sizing say so


class OtherLoad:
    """The share of this machine's cores that other processes used while the block ran (the system's busy
    CPU time less this process's)."""

    def __enter__(self) -> "OtherLoad":
        import psutil

        self.process = psutil.Process()
        self.started = time.monotonic()
        self.system, self.own = self._busy(psutil.cpu_times()), sum(self.process.cpu_times()[:2])
        self.share = 0.0
        return self

    def __exit__(self, *exc) -> None:
        import psutil

        wall = time.monotonic() - self.started
        other = (self._busy(psutil.cpu_times()) - self.system) - (sum(self.process.cpu_times()[:2]) - self.own)
        self.share = max(0.0, other / max(wall * psutil.cpu_count(), 1e-9))

    @staticmethod
    def _busy(times) -> float:
        return times.user + times.system + getattr(times, "nice", 0.0)


REPLAN_AFTER = 10  # steps the loop times (after its first) before it re-plans
REPLAN_CHANGE = 0.1  # a re-plan that moves the step count by less than this share is not made


def replanned_steps(
    max_steps: int, step_budget_s: float, step_s: float, done: int, most: int | None = None
) -> int | None:
    """The step count that fills `step_budget_s` at `step_s` a step (the loop's own timing), at most `most`
    (MAX_EPOCHS' steps), or None when it is within REPLAN_CHANGE of max_steps; never fewer than the steps
    done and one more."""
    steps = max(done + 1, min(int(step_budget_s / step_s), most or math.inf))
    return steps if abs(steps - max_steps) > REPLAN_CHANGE * max_steps else None


def _accepts(plan, cfg) -> bool:
    try:
        plan.validate(cfg.model, cfg)
        return True
    except PipelineError:
        return False
