"""Tiny Transformers that train on a CPU in seconds, for the book's experiments.

* :class:`TinyDecoder` -- decoder-only language model. ``causal=False`` removes
  the causal mask so the leakage experiment can show what goes wrong.
* :class:`TinyEncoderDecoder` -- encoder-decoder with the three masks of
  :func:`attnmask.encoder_decoder_masks` and cached cross-attention.

Both decode incrementally with :class:`attnmask.KVCache`; the cached path
gives the same logits as the full forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .cache import KVCache
from .masks import causal_mask, combine_masks, encoder_decoder_masks
from .mha import MultiHeadAttention

__all__ = ["ModelConfig", "TinyDecoder", "TinyEncoderDecoder", "train_steps"]


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    max_len: int = 64
    causal: bool = True  # decoder self-attention; False leaks the future


class Block(nn.Module):
    """Pre-norm Transformer block: self-attention, optional cross-attention, MLP."""

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        D = cfg.d_model
        self.ln1 = nn.LayerNorm(D)
        self.attn = MultiHeadAttention(D, cfg.n_heads)
        self.cross = MultiHeadAttention(D, cfg.n_heads) if cross else None
        self.ln_x = nn.LayerNorm(D) if cross else None
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, mask, memory=None, cross_mask=None, cache=None, cross_cache=None):
        """x ``(B, L, D)``; memory ``(B, S, D)`` for cross-attention."""
        x = x + self.attn(self.ln1(x), mask=mask, cache=cache)
        if self.cross is not None:
            x = x + self.cross(self.ln_x(x), memory, mask=cross_mask, cache=cross_cache, cross=True)
        return x + self.mlp(self.ln2(x))


class _Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)

    def forward(self, idx, start: int = 0):
        """idx ``(B, L)`` -> ``(B, L, D)``; positions start at ``start``."""
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class TinyDecoder(nn.Module):
    """Decoder-only language model: ``forward(idx (B, L)) -> logits (B, L, V)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = _Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, idx, key_mask=None, caches=None):
        """idx ``(B, L)`` new tokens; key_mask bool ``(B, Lk)`` (True = real key);
        caches: one :class:`KVCache` per layer, or None. Returns ``(B, L, V)``."""
        L = idx.shape[1]
        past = len(caches[0]) if caches else 0
        mask = None
        if self.cfg.causal:
            mask = causal_mask(L, n_keys=past + L, device=idx.device)  # (L, past+L)
        if key_mask is not None:
            mask = combine_masks(mask, key_mask[:, None, None, :])  # (B, 1, L, Lk)
        x = self.embed(idx, start=past)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache=caches[i] if caches else None)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, idx, n_new: int, *, use_cache: bool = True):
        """Greedy continuation of ``idx (B, L)`` by ``n_new`` tokens -> ``(B, L + n_new)``."""
        caches = [KVCache() for _ in self.blocks] if use_cache else None
        out, step_in = idx, idx
        for _ in range(n_new):
            logits = self(step_in, caches=caches) if use_cache else self(out)
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            step_in = nxt
        return out


class TinyEncoderDecoder(nn.Module):
    """Encoder-decoder: ``forward(src (B, S), tgt_in (B, T), src_lengths, tgt_lengths)
    -> logits (B, T, V)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.src_embed = _Embed(cfg)
        self.tgt_embed = _Embed(cfg)
        self.encoder = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(Block(cfg, cross=True) for _ in range(cfg.n_layers))
        self.ln_e = nn.LayerNorm(cfg.d_model)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def encode(self, src, enc_mask):
        """src ``(B, S)`` -> memory ``(B, S, D)``."""
        x = self.src_embed(src)
        for block in self.encoder:
            x = block(x, enc_mask)
        return self.ln_e(x)

    def decode(self, tgt, memory, dec_mask, cross_mask, caches=None, start: int = 0):
        """tgt ``(B, T)`` -> logits ``(B, T, V)``; caches: (self, cross) per layer."""
        x = self.tgt_embed(tgt, start=start)
        for i, block in enumerate(self.decoder):
            c, cc = caches[i] if caches else (None, None)
            x = block(x, dec_mask, memory, cross_mask, cache=c, cross_cache=cc)
        return self.head(self.ln_f(x))

    def forward(self, src, tgt_in, src_lengths, tgt_lengths):
        enc_m, dec_m, cross_m = encoder_decoder_masks(
            src_lengths, tgt_lengths, src.shape[1], tgt_in.shape[1]
        )
        memory = self.encode(src, enc_m)
        return self.decode(tgt_in, memory, dec_m, cross_m)

    @torch.no_grad()
    def greedy_decode(self, src, src_lengths, bos: int, n_steps: int, *, use_cache: bool = True):
        """Greedy decoding from ``bos`` -> ``(B, 1 + n_steps)``. With the cache, each
        step feeds one token; the encoder's keys/values are computed once."""
        B, S = src.shape
        full = torch.full((B,), S, device=src.device)
        enc_m, _, cross_m = encoder_decoder_masks(src_lengths, full, S, 1)
        memory = self.encode(src, enc_m)
        out = torch.full((B, 1), bos, dtype=torch.long, device=src.device)
        caches = [(KVCache(), KVCache()) for _ in self.decoder] if use_cache else None
        for t in range(n_steps):
            if use_cache:
                # One new query over all cached keys: nothing in the future to hide.
                logits = self.decode(out[:, -1:], memory, None, cross_m, caches, start=t)
            else:
                T = out.shape[1]
                dec_m = causal_mask(T, device=src.device)
                logits = self.decode(out, memory, dec_m, cross_m)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out


def train_steps(model: nn.Module, loss_fn, n_steps: int, *, lr: float = 3e-3, seed: int = 0):
    """Run ``n_steps`` of AdamW on ``loss_fn(model, step) -> scalar loss``;
    return the list of losses (floats)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step in range(n_steps):
        loss = loss_fn(model, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
