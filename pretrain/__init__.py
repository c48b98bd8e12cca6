"""Pretraining stage: tokenizer, token files, GPT-2 training, checkpoints and Hugging Face export."""
