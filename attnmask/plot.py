"""Pictures of masks and attention weights (matplotlib).

Convention in every picture: rows are queries (top = first), columns are keys
(left = first). For masks, allowed cells are dark and blocked cells light, with
a legend, so a reader never has to guess the colour code.
"""

from __future__ import annotations

import torch

__all__ = ["plot_attention", "plot_mask", "plot_masks", "plot_values"]

ALLOWED = "#1f4e79"  # dark: may attend
BLOCKED = "#f2f2f2"  # light: blocked


def _as_2d(t: torch.Tensor, what: str) -> torch.Tensor:
    t = t.detach().cpu()
    while t.dim() > 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2:
        raise ValueError(f"{what} must reduce to (Lq, Lk); got shape {tuple(t.shape)} -- index it first")
    return t


def plot_mask(mask: torch.Tensor, ax=None, *, title: str = "mask", labels=None, legend: bool = True):
    """Draw a boolean mask ``(Lq, Lk)`` (True = may attend) as a grid."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    m = _as_2d(mask, "mask").to(torch.bool)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    cmap = ListedColormap([BLOCKED, ALLOWED])
    ax.imshow(m.numpy(), cmap=cmap, vmin=0, vmax=1)
    Lq, Lk = m.shape
    ax.set_xticks(range(Lk))
    ax.set_yticks(range(Lq))
    if labels is not None:
        ax.set_xticklabels(labels[-Lk:])
        ax.set_yticklabels(labels[-Lq:])
    ax.set_xticks([x - 0.5 for x in range(1, Lk)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, Lq)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0, labelsize=7)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title)
    if legend:
        # Beside the grid, not under it: under a short, wide mask it would cover the x label.
        ax.legend(handles=_legend_handles(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  fontsize=7, frameon=False)
    return ax


def _legend_handles():
    from matplotlib.patches import Patch

    return [Patch(facecolor=ALLOWED, edgecolor="#888888", label="may attend"),
            Patch(facecolor=BLOCKED, edgecolor="#888888", label="blocked")]


def plot_masks(masks: dict, *, suptitle: str | None = None, legend: bool = True):
    """Several masks side by side: ``{title: mask (Lq, Lk)}``."""
    import matplotlib.pyplot as plt

    # Constrained layout leaves room for the suptitle and for a legend "outside" the panels.
    fig, axes = plt.subplots(1, len(masks), figsize=(3.0 * len(masks), 3.6), squeeze=False,
                             layout="constrained")
    for ax, (title, m) in zip(axes[0], masks.items()):
        plot_mask(m, ax, title=title, legend=False)
    if suptitle:
        fig.suptitle(suptitle)
    if legend:
        fig.legend(handles=_legend_handles(), loc="outside lower center", ncol=2, fontsize=8,
                   frameon=False)
    return fig


def plot_attention(weights: torch.Tensor, ax=None, *, title: str = "attention weights",
                   q_labels=None, k_labels=None, annotate: bool = False, cmap: str = "viridis"):
    """Heatmap of attention weights ``(Lq, Lk)`` (each row sums to 1 or is 0)."""
    import matplotlib.pyplot as plt

    w = _as_2d(weights, "weights").float()
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 3.2))
    im = ax.imshow(w.numpy(), cmap=cmap, vmin=0, vmax=max(1e-9, float(w.max())))
    Lq, Lk = w.shape
    ax.set_xticks(range(Lk))
    ax.set_yticks(range(Lq))
    if k_labels is not None:
        ax.set_xticklabels(k_labels)
    if q_labels is not None:
        ax.set_yticklabels(q_labels)
    ax.tick_params(labelsize=7)
    if annotate:
        for i in range(Lq):
            for j in range(Lk):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if w[i, j] < 0.5 * float(w.max()) else "black")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_values(values: torch.Tensor, ax=None, *, title: str = "values", blocked: torch.Tensor | None = None,
                cmap: str = "RdBu_r", fontsize: int = 10):
    """Heatmap of a 2-D float tensor ``(rows, cols)`` with each value written in its cell.

    ``blocked`` (bool, broadcastable to ``values``, True = blocked) cells are drawn in the
    light colour of a blocked mask cell; −∞ is written as "−∞". Colours are pale (limits at
    1.6 × the largest finite magnitude) so that the numbers stay legible.
    """
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    v = _as_2d(values, "values").double()
    shown = v.clone()
    if blocked is not None:
        shown[torch.broadcast_to(blocked.cpu(), v.shape)] = float("nan")
    colours = mpl.colormaps[cmap].copy()
    colours.set_bad(BLOCKED)
    finite = v[torch.isfinite(v)]
    lim = 1.6 * float(finite.abs().max()) if finite.numel() else 1.0
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    ax.imshow(shown.numpy(), cmap=colours, vmin=-lim, vmax=lim)
    rows, cols = v.shape
    for i in range(rows):
        for j in range(cols):
            x = float(v[i, j])
            ax.text(j, i, "−∞" if x == float("-inf") else f"{x:.2f}", ha="center", va="center",
                    fontsize=fontsize)
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.tick_params(labelsize=9)
    ax.set_title(title)
    return ax
