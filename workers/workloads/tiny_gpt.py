"""Built-in ``tiny_gpt`` workload: a character-level (UTF-8 byte) decoder-only transformer.

The text is a file the user points at (``config["text_path"]``, readable on every worker node); its
first ``1 - val_fraction`` bytes train, the rest validate. A sample is ``context`` bytes and the same
window shifted by one; windows do not overlap, so an epoch is one pass over the text.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from orchestrator_contract.workloads import TinyGptConfig
from workers.serve.predictors import BadInput, as_number, device_of, only_keys
from workers.workloads.base import Workload


class ByteWindows(Dataset):
    """Non-overlapping ``(x, y)`` windows of a byte sequence; ``y`` is ``x`` shifted by one byte."""

    def __init__(self, data: torch.Tensor, context: int) -> None:
        self.data, self.context = data, context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.context
        window = self.data[start : start + self.context + 1].long()
        return window[:-1], window[1:]


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x MLP, each residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for t in self.qkv(self.ln1(x)).split(width, dim=-1)
        )
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyGpt(nn.Module):
    def __init__(self, cfg: TinyGptConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(cfg.vocab_size, cfg.width)
        self.position = nn.Embedding(cfg.context, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.heads, cfg.dropout) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.apply(_init_weights)  # from torch's global RNG, which the loop seeds

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [batch, length <= context]`` -> logits ``[batch, length, vocab]``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.token(tokens) + self.position(positions))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.token.weight)  # the head is the token embedding, tied


def _init_weights(module: nn.Module) -> None:
    # GPT-2's: small normal weights (the tied head would give huge first logits with N(0, 1)), zero bias.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_model(config: dict) -> nn.Module:
    """The untrained model; reads no text."""
    return TinyGpt(TinyGptConfig.model_validate(config))


def _read_bytes(cfg: TinyGptConfig) -> torch.Tensor:
    try:
        with open(cfg.text_path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ValueError(f"tiny_gpt: cannot read text_path {cfg.text_path!r}: {exc.strerror or exc}") from exc
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    if len(tensor) and int(tensor.max()) >= cfg.vocab_size:
        raise ValueError(
            f"tiny_gpt: {cfg.text_path!r} holds byte {int(tensor.max())}, outside vocab_size {cfg.vocab_size}"
        )
    return tensor


def build(config: dict, seed: int) -> Workload:
    """``seed`` is unused: the split is by position, and the loop seeds the init and the sampler."""
    cfg = TinyGptConfig.model_validate(config)
    data = _read_bytes(cfg)
    split = int(len(data) * (1 - cfg.val_fraction))
    train, val = data[:split].clone(), data[split:].clone()  # each its own storage: pickles alone
    if min(len(train), len(val)) < cfg.context + 1:
        raise ValueError(
            f"tiny_gpt: {cfg.text_path!r} is too short: {len(data)} bytes give {len(train)} to train and "
            f"{len(val)} to validate (val_fraction {cfg.val_fraction}); each needs at least context + 1 = "
            f"{cfg.context + 1}"
        )
    return Workload(
        model=build_model(config),
        train_dataset=ByteWindows(train, cfg.context),
        val_dataset=ByteWindows(val, cfg.context),
        fsdp_blocks=lambda model: model.blocks,
        targets_per_sample=cfg.context,
    )


# --- serving ------------------------------------------------------------------------------------------

MAX_PROMPT_BYTES = 4096
MAX_NEW_TOKENS = 256


class TinyGptPredictor:
    """``{"prompt": "...", "max_new_tokens": 32, "temperature": 0, "seed": 0}`` -> generated text.

    Byte-level, like the workload: the prompt's UTF-8 bytes are the tokens, the last ``context`` of
    them condition each next byte. ``temperature`` 0 is greedy (argmax); above 0 samples, seeded.
    """

    expected = {
        "prompt": f"text, 1 to {MAX_PROMPT_BYTES} UTF-8 bytes",
        "max_new_tokens": f"optional, 1 to {MAX_NEW_TOKENS} (default 32)",
        "temperature": "optional, 0 (greedy, default) to 5",
        "seed": "optional integer for sampling (default 0)",
    }

    def __init__(self, model: nn.Module, config: dict):
        self.model = model
        self.device = device_of(model)
        cfg = TinyGptConfig.model_validate(config)
        self.context, self.vocab_size = cfg.context, cfg.vocab_size

    def parse(self, body: Any) -> dict:
        body = only_keys(body, ["prompt", "max_new_tokens", "temperature", "seed"], ["prompt"])
        prompt = body["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise BadInput("'prompt' must be a non-empty string")
        tokens = list(prompt.encode("utf-8"))
        if len(tokens) > MAX_PROMPT_BYTES:
            raise BadInput(f"'prompt' is {len(tokens)} bytes: at most {MAX_PROMPT_BYTES}")
        if max(tokens) >= self.vocab_size:
            raise BadInput(f"'prompt' holds bytes outside this model's vocabulary of {self.vocab_size}")
        new_tokens = body.get("max_new_tokens", 32)
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or not 1 <= new_tokens <= MAX_NEW_TOKENS:
            raise BadInput(f"'max_new_tokens' must be an integer from 1 to {MAX_NEW_TOKENS}")
        temperature = as_number(body.get("temperature", 0.0), "'temperature'")
        if not 0 <= temperature <= 5:
            raise BadInput("'temperature' must be from 0 to 5")
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise BadInput("'seed' must be a non-negative integer")
        return {"tokens": tokens, "max_new_tokens": new_tokens, "temperature": temperature, "seed": seed}

    @torch.no_grad()
    def predict(self, items: list[dict]) -> list[dict]:
        return [self._generate(**item) for item in items]  # prompts differ in length: one at a time

    def _generate(self, tokens: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
        generator = torch.Generator().manual_seed(seed)
        out = list(tokens)
        for _ in range(max_new_tokens):
            logits = self.model(torch.tensor([out[-self.context :]], device=self.device))[0, -1].float().cpu()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                probabilities = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probabilities, 1, generator=generator))
            out.append(token)
        generated = bytes(out[len(tokens) :])
        return {"text": generated.decode("utf-8", errors="replace"), "tokens": len(generated)}

    def probe(self) -> None:
        with torch.no_grad():
            output = self.model(torch.zeros((1, 1), dtype=torch.long, device=self.device))
        if not torch.isfinite(output).all():
            raise RuntimeError("the model answers non-finite values")
