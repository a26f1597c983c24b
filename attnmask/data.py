"""Small data sets made here, for experiments that train in seconds on a CPU.

Nothing is downloaded: the text is ours and the toy tasks are generated from a
seeded ``torch.Generator``.
"""

from __future__ import annotations

import torch

__all__ = ["CharVocab", "TEXT", "lm_batch", "reverse_batch"]

TEXT = (
    "a mask decides which keys a query may read. the causal mask hides the future, "
    "the padding mask hides the filler, and the two are joined with a logical and. "
    "scores of hidden keys become minus infinity before the softmax, so their weight "
    "is exactly zero and the rest still sums to one. a model trained without the mask "
    "learns to copy the next token instead of predicting it, and fails when it has to "
    "write on its own. "
) * 4


class CharVocab:
    """Character-level vocabulary over a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def lm_batch(data: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Random windows of a token stream ``data (N,)`` -> ``(x, y)`` each ``(B, L)``,
    where ``y`` is ``x`` shifted left by one (next-token targets)."""
    starts = torch.randint(0, data.numel() - length - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(length)  # (B, L)
    return data[idx], data[idx + 1]


def reverse_batch(batch: int, max_len: int, n_symbols: int, gen: torch.Generator):
    """Toy translation: reverse a sequence of symbols of random length.

    Token ids: 0 = PAD, 1 = BOS, 2 = EOS, symbols 3 .. 3 + n_symbols - 1.

    Returns:
        ``src (B, S)``, ``src_lengths (B,)``, ``tgt_in (B, T)``, ``tgt_out (B, T)``,
        ``tgt_lengths (B,)`` with ``S = max_len`` and ``T = max_len + 1``;
        ``tgt_in`` starts with BOS and ``tgt_out`` ends with EOS; padding is 0.
    """
    lengths = torch.randint(2, max_len + 1, (batch,), generator=gen)
    sym = torch.randint(3, 3 + n_symbols, (batch, max_len), generator=gen)
    pos = torch.arange(max_len)
    valid = pos[None, :] < lengths[:, None]  # (B, S)
    src = torch.where(valid, sym, 0)
    # reversed[b, i] = src[b, lengths[b] - 1 - i] for i < lengths[b]
    rev_idx = (lengths[:, None] - 1 - pos[None, :]).clamp(min=0)
    rev = torch.where(valid, torch.gather(src, 1, rev_idx), 0)
    T = max_len + 1
    tgt_in = torch.zeros(batch, T, dtype=torch.long)
    tgt_in[:, 0] = 1
    tgt_in[:, 1:] = rev
    tgt_out = torch.zeros(batch, T, dtype=torch.long)
    tgt_out[:, :max_len] = rev
    tgt_out[torch.arange(batch), lengths] = 2
    return src, lengths, tgt_in, tgt_out, lengths + 1
