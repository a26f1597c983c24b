"""``python -m attnmask.demo``: a two-second tour that shows the package working.

Prints the causal, padding, sliding-window, prefix-LM and document masks, checks
the explicit and fused attention paths against each other, and checks cached
decoding against the full forward pass.
"""

from __future__ import annotations

import torch

from . import (
    attention,
    causal_mask,
    decoder_mask,
    document_mask,
    kv_cache_attention,
    prefix_lm_mask,
    sliding_window_mask,
)


def grid(mask: torch.Tensor) -> str:
    return "\n".join("  " + " ".join("■" if v else "·" for v in row) for row in mask.tolist())


def main() -> None:
    torch.manual_seed(0)
    print("Masks (rows = queries, columns = keys, ■ = may attend)\n")
    shown = {
        "causal_mask(5)": causal_mask(5),
        "causal_mask(2, n_keys=5) -- bottom-right, for a KV cache": causal_mask(2, n_keys=5),
        "decoder_mask(lengths=[3], 5)": decoder_mask(torch.tensor([3]), 5)[0, 0],
        "sliding_window_mask(5, window=2)": sliding_window_mask(5, 2),
        "prefix_lm_mask(5, prefix_len=2)": prefix_lm_mask(5, 2),
        "document_mask([[0, 0, 1, 1, 1]])": document_mask(torch.tensor([[0, 0, 1, 1, 1]]))[0, 0],
    }
    for title, m in shown.items():
        print(f"{title}\n{grid(m)}\n")

    B, H, L, d = 2, 4, 16, 8
    q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
    mask = causal_mask(L)
    slow, _ = attention(q, k, v, mask)
    fast, _ = attention(q, k, v, mask, need_weights=False)
    print(f"explicit vs fused SDPA path, max |diff| = {(slow - fast).abs().max().item():.1e}")

    T = 10
    out, k_all, _ = kv_cache_attention(q[..., T:, :], k[..., T:, :], v[..., T:, :],
                                       k[..., :T, :], v[..., :T, :])
    err = (out - slow[..., T:, :]).abs().max().item()
    print(f"KV-cache decoding of {L - T} tokens after {T} cached vs full pass, max |diff| = {err:.1e}")


if __name__ == "__main__":
    main()
