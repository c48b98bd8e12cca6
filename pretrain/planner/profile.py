"""What is trained, as the cost model needs it: the Workload (model, sequence length, global batch,
bytes per value) and the model's profile.

profile_model() builds the GPT on the meta device (accelerate's init_empty_weights: no memory, so
GPT-2 large costs nothing) and runs one block, the embeddings and the head forward and backward on
meta tensors, counting per sequence: parameters, the bytes autograd saves for backward (activations),
the FLOPs of each matmul (torch's FLOP formulas), bytes moved by non-matmul ops and the number of ops.
Tensor-parallel shards are traced as the narrower blocks they are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from common.errors import PipelineError
from pretrain.config import ModelConfig

# The six linears tensor parallelism shards (q, k, v, out_proj, fc_in, fc_out) run on DTensors, each
# dispatching about this many DTensor ops forward and backward (tensor parallelism's extra host cost).
TP_SHARDED_LINEARS = 6
DTENSOR_OPS_PER_LINEAR_FWD, DTENSOR_OPS_PER_LINEAR_BWD = 3, 4


@dataclass
class Workload:
    model: ModelConfig
    seq_len: int
    global_batch: int  # sequences per optimizer step
    act_bytes: int = 4  # 2 under bf16 autocast
    param_bytes: int = 4  # fp32 parameters, gradients and AdamW states

    def validate(self) -> None:
        if self.seq_len < 1 or self.global_batch < 1:
            raise PipelineError(
                f"--seq-len and --global-batch must be positive, got {self.seq_len} and {self.global_batch}"
            )
        if self.seq_len > self.model.block_size:
            raise PipelineError(f"--seq-len {self.seq_len} exceeds the model's block size {self.model.block_size}")
        if self.model.n_embd % self.model.n_head:
            raise PipelineError(f"n_embd {self.model.n_embd} is not divisible by n_head {self.model.n_head}")


@dataclass
class OpCost:
    """Work of a forward or backward pass: the FLOPs of each matmul-like call (their sizes matter: small
    matmuls run far below a device's peak), bytes moved by non-matmul ops, ops dispatched, and those of
    them on DTensors (tensor parallelism's extra host cost)."""

    matmuls: tuple[float, ...] = ()  # FLOPs per call
    bytes: float = 0.0
    ops: float = 0.0
    dtensor_ops: float = 0.0

    @property
    def flops(self) -> float:
        return sum(self.matmuls)

    def for_rows(self, rows: int) -> "OpCost":
        """This per-sequence cost for a microbatch of `rows` sequences: each matmul and the bytes scale,
        op counts do not."""
        return OpCost(tuple(f * rows for f in self.matmuls), self.bytes * rows, self.ops, self.dtensor_ops)

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(
            self.matmuls + other.matmuls,
            self.bytes + other.bytes,
            self.ops + other.ops,
            self.dtensor_ops + other.dtensor_ops,
        )


@dataclass
class PartProfile:
    """One part of the model (a block sharded over tp ranks, the embeddings, the head + loss) for a
    microbatch of `rows` sequences."""

    params: int  # held by one rank
    fwd: OpCost
    bwd: OpCost
    saved_bytes: float  # activations kept for backward


# ---------------------------------------------------------------- tracing on the meta device


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is not None


class _Counter:
    """A TorchDispatchMode that counts ops, the FLOPs of each matmul-like call (torch's FLOP formulas)
    and the bytes non-matmul ops read and write."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                counter.ops += 1
                if func.overloadpacket in flop_registry:
                    counter.matmuls.append(float(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)))
                elif not _is_view(func):
                    import torch
                    from torch.utils._pytree import tree_leaves

                    counter.bytes += sum(
                        t.numel() * t.element_size()
                        for t in tree_leaves((args, kwargs, out))
                        if isinstance(t, torch.Tensor)
                    )
                return out

        self.mode = Mode()
        self.ops, self.bytes, self.matmuls = 0, 0, []

    def cost(self) -> "OpCost":
        return OpCost(tuple(self.matmuls), self.bytes, self.ops)


def _trace(module, make_input, loss_fn, act_dtype, seq_len: int) -> tuple[OpCost, OpCost, float]:
    """Forward and backward of `module` on meta tensors: (fwd cost, bwd cost, saved activation bytes).

    Meta tensors take scaled_dot_product_attention's math path, which saves the (seq × seq) attention
    matrix; the fused kernels training uses on CPU and GPU save one logsumexp per row instead, so such
    saved tensors are counted at that size."""
    import torch

    params = {p.untyped_storage()._cdata for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in params:
            nbytes = t.untyped_storage().nbytes()
            if t.dim() >= 2 and t.shape[-1] == seq_len and t.shape[-2] == seq_len and seq_len > 1:
                nbytes //= seq_len
            saved[key] = max(saved.get(key, 0), nbytes)
        return t

    x = make_input()
    counter = _Counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with counter.mode:
            out = module(x)
            loss = loss_fn(out)
    counter_b = _Counter()
    with counter_b.mode:
        loss.backward()
    fwd, bwd = counter.cost(), counter_b.cost()
    return fwd, bwd, float(sum(saved.values()))


def _sharded_block(model_cfg: ModelConfig, tp: int):
    """One transformer block as a tensor-parallel rank holds it: n_head/tp heads, 4d/tp MLP units."""
    import torch.nn as nn

    from pretrain.model import Block

    d = model_cfg.n_embd
    block = Block(model_cfg)
    if tp > 1:
        attn, mlp = block.attn, block.mlp
        attn.q_proj, attn.k_proj, attn.v_proj = (nn.Linear(d, d // tp) for _ in range(3))
        attn.out_proj = nn.Linear(d // tp, d)
        mlp.fc_in, mlp.fc_out = nn.Linear(d, 4 * d // tp), nn.Linear(4 * d // tp, d)
    return block


@dataclass
class ModelProfile:
    """What the cost model needs to know about the model, per microbatch row (sequence)."""

    cfg: ModelConfig
    seq_len: int
    act_bytes: int
    total_params: int
    block_params: int
    block_tp_sharded: int  # of block_params, those split by tensor parallelism
    block_tensors: int  # parameter tensors in a block (the optimizer's host cost is per tensor)
    embed_params: int  # token + position embeddings
    head_params: int  # final LayerNorm + lm_head (the tied weight counted again: a last stage holds a copy)
    _traces: dict = field(default_factory=dict)

    def block(self, tp: int) -> PartProfile:
        return self._part("block", tp)

    def embed(self) -> PartProfile:
        return self._part("embed", 1)

    def head(self) -> PartProfile:
        return self._part("head", 1)

    def _part(self, kind: str, tp: int) -> PartProfile:
        """Per microbatch row: traced once per (kind, tp) at one sequence (all costs are linear in rows
        except op counts, which are per microbatch)."""
        key = (kind, tp)
        if key not in self._traces:
            self._traces[key] = _trace_part(self.cfg, self.seq_len, kind, tp, self.act_bytes)
        return self._traces[key]

    def block_params_on_rank(self, tp: int) -> float:
        return self.block_tp_sharded / tp + (self.block_params - self.block_tp_sharded)


def _trace_part(cfg: ModelConfig, seq_len: int, kind: str, tp: int, act_bytes: int) -> PartProfile:
    import torch
    from accelerate import init_empty_weights

    from pretrain.model import GPT, lm_loss

    dtype = torch.bfloat16 if act_bytes == 2 else torch.float32
    with init_empty_weights():
        if kind == "block":
            module = _sharded_block(cfg, tp)
        else:
            module = GPT(replace(cfg, n_layer=0))
            if kind == "embed":
                module.ln_f = module.lm_head = None
            else:
                module.tok_emb = module.pos_emb = None
    module = module.to(dtype)
    d = cfg.n_embd
    if kind == "embed":
        fwd, bwd, saved = _trace(
            module,
            lambda: torch.zeros(1, seq_len, dtype=torch.long, device="meta"),
            lambda out: out.float().sum(),
            dtype,
            seq_len,
        )
    elif kind == "head":
        target = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        fwd, bwd, saved = _trace(
            module,
            lambda: torch.zeros(1, seq_len, d, device="meta", dtype=dtype, requires_grad=True),
            lambda out: lm_loss(out, target),
            dtype,
            seq_len,
        )
    else:
        fwd, bwd, saved = _trace(
            module,
            lambda: torch.zeros(1, seq_len, d, device="meta", dtype=dtype, requires_grad=True),
            lambda out: out.float().sum(),
            dtype,
            seq_len,
        )
        if tp > 1:
            fwd.dtensor_ops = TP_SHARDED_LINEARS * DTENSOR_OPS_PER_LINEAR_FWD
            bwd.dtensor_ops = TP_SHARDED_LINEARS * DTENSOR_OPS_PER_LINEAR_BWD
    params = sum(p.numel() for p in module.parameters())
    return PartProfile(params, fwd, bwd, saved)


@functools.lru_cache(maxsize=32)
def profile_model(cfg: ModelConfig, seq_len: int, act_bytes: int = 4) -> ModelProfile:
    """The model's profile, built on the meta device (cached: planning many plans traces each part once)."""
    from accelerate import init_empty_weights

    from pretrain.model import GPT

    with init_empty_weights():
        model = GPT(cfg)
        block = model.layers["0"] if cfg.n_layer else None
    block_params = sum(p.numel() for p in block.parameters()) if block is not None else 0
    sharded = 0
    if block is not None:
        for name, p in block.named_parameters():
            # column-split q/k/v/fc_in (weights and biases), row-split out_proj/fc_out weights
            if any(k in name for k in ("q_proj", "k_proj", "v_proj", "fc_in")) or name.endswith(
                ("out_proj.weight", "fc_out.weight")
            ):
                sharded += p.numel()
    embed = cfg.vocab_size * cfg.n_embd + cfg.block_size * cfg.n_embd
    head = 2 * cfg.n_embd + cfg.vocab_size * cfg.n_embd
    # Not model.num_params(): init_empty_weights re-creates a parameter when it is assigned, which unties
    # lm_head from tok_emb on the meta device. The tied weight counts once.
    total = cfg.n_layer * block_params + embed + 2 * cfg.n_embd
    block_tensors = len(list(block.parameters())) if block is not None else 0
    return ModelProfile(cfg, seq_len, act_bytes, total, block_params, sharded, block_tensors, embed, head)
