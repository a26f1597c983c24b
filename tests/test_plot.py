"""Plot helpers draw what they are given, with a title and axis labels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import attnmask as am  # noqa: E402
from attnmask.plot import plot_attention, plot_mask, plot_masks, plot_values  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def assert_labelled(ax, title: str) -> None:
    assert ax.get_title() == title
    assert ax.get_xlabel() and ax.get_ylabel(), "every figure needs axis labels"
    assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()


def test_plot_mask_draws_the_mask():
    mask = am.causal_mask(5, n_keys=7)
    ax = plot_mask(mask, title="bottom-right causal")
    assert_labelled(ax, "bottom-right causal")
    image = ax.get_images()[0].get_array()
    assert image.shape == (5, 7)
    assert np.array_equal(np.asarray(image).astype(bool), mask.numpy())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["may attend", "blocked"]


def test_plot_mask_squeezes_leading_ones_and_takes_labels():
    mask = am.decoder_mask(torch.tensor([3]), 4)  # (1, 1, 4, 4)
    ax = plot_mask(mask, labels=list("abcd"), legend=False)
    assert ax.get_legend() is None and ax.get_images()[0].get_array().shape == (4, 4)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcd")


def test_plot_masks_side_by_side():
    fig = plot_masks({"causal": am.causal_mask(4), "window": am.sliding_window_mask(4, 2)}, suptitle="masks")
    assert len(fig.axes) == 2 and fig._suptitle.get_text() == "masks"
    for ax, title in zip(fig.axes, ["causal", "window"]):
        assert_labelled(ax, title)


def test_plot_attention_draws_the_weights():
    q = k = v = torch.randn(4, 3)
    _, w = am.attention(q, k, v, am.causal_mask(4))
    ax = plot_attention(w, title="weights", annotate=True, q_labels=list("wxyz"), k_labels=list("wxyz"))
    assert_labelled(ax, "weights")
    np.testing.assert_allclose(np.asarray(ax.get_images()[0].get_array()), w.numpy(), rtol=1e-6)
    assert len(ax.texts) == 16, "annotate writes one number per cell"
    assert len(ax.figure.axes) == 2, "a colour bar explains the scale"


def test_plot_attention_accepts_low_precision_and_grad():
    w = torch.softmax(torch.randn(3, 3, requires_grad=True), -1).to(torch.bfloat16)
    assert_labelled(plot_attention(w), "attention weights")


@pytest.mark.parametrize("plot", [plot_mask, plot_attention])
def test_more_than_two_real_dimensions_is_an_error(plot):
    with pytest.raises(ValueError, match=r"\(Lq, Lk\).*\(2, 1, 4, 4\).*index it first"):
        plot(am.decoder_mask(torch.tensor([3, 4]), 4).float())


def test_plot_values_writes_each_value_and_greys_blocked_cells():
    scores = torch.tensor([[0.5, -1.25], [2.0, 0.0]])
    blocked = torch.tensor([[False, True], [False, False]])
    ax = plot_values(scores + am.to_additive(~blocked), title="scores", blocked=blocked)
    assert [t.get_text() for t in ax.texts] == ["0.50", "−∞", "2.00", "0.00"]
    image = ax.images[0].get_array()
    assert bool(image.mask[0, 1]) and not bool(image.mask[1, 0])  # the blocked cell is drawn as "bad"
    assert ax.get_title() == "scores"
    plt.close("all")
