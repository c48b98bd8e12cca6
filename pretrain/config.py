"""Configuration as dataclasses; the CLI overrides fields by name."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    vocab_size: int = 8192
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 256  # maximum sequence length (learned position embeddings)
    dropout: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# GPT-2 shapes: small / medium / large are the published 124M / 355M / 774M models
# (with the 50,257-token vocabulary; ours is trained on the user's data and usually smaller).
PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
    "large": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024),
}

# Sensible training defaults per preset: the tiny one finishes in a few minutes on 2 CPU cores.
PRESET_TRAINING: dict[str, dict] = {
    "tiny": dict(max_steps=300, seq_len=128, batch_size=16, lr=1e-3, vocab_size=4096),
    "small": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=6e-4, vocab_size=32768),
    "medium": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=3e-4, vocab_size=32768),
    "large": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=2.5e-4, vocab_size=32768),
}


@dataclass
class TrainConfig:
    preset: str = "tiny"
    max_steps: int = 300
    seq_len: int = 128
    batch_size: int = 16  # sequences per optimizer step (global, whatever the parallel plan)
    grad_accum: int = 1  # the batch is split into this many micro-batches
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0  # 0 means 5% of max_steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    vocab_size: int = 4096
    val_fraction: float = 0.05
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 100
    log_every: int = 10
    measure_comm: bool = True  # profile the last step of each log window for its time in communication
    model: ModelConfig = field(default_factory=ModelConfig)

    @property
    def warmup(self) -> int:
        return self.warmup_steps or max(1, self.max_steps // 20)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum


def model_config_for(preset: str, vocab_size: int, seq_len: int, **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    shape = dict(PRESETS[preset])
    shape["block_size"] = max(shape["block_size"], seq_len)
    shape.update(overrides)
    return ModelConfig(vocab_size=vocab_size, **shape)


def train_config_from_dict(raw: dict) -> TrainConfig:
    """The inverse of dataclasses.asdict(TrainConfig): for checkpoints and for launching workers."""
    raw = dict(raw)
    model = ModelConfig(**raw.pop("model"))
    return TrainConfig(**raw, model=model)
