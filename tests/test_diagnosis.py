"""attnmask.diagnosis: the leaking layer and the padding test, against their construction.

The oracle is how each model was built (which layer lost its causality, which mask style a
decoder uses); the margins hold for the models the grader draws, so that neither answer
depends on float noise.
"""

from __future__ import annotations

import pytest
import torch

import attnmask as am
from attnmask import diagnosis as dx
from grader.checks import EXERCISES
from grader.checks.common.judges import cpu_args
from grader.fnspecs import build


def specs_of(name: str, seed: int):
    for check in EXERCISES[name].make_checks(seed, hidden=True):
        yield from check.calls


def leak_at_of(spec) -> int | None:
    """The construction's answer: the index of the layer built without causality."""
    causal = [layer["causal"] for layer in spec.params["layers"]]
    return causal.index(False) if False in causal else None


def random_built(spec) -> bool:
    """Whether the model is one of the random stacks (attention, conv and mlp layers only), whose
    answer is its construction's; the special ones are checked in the next test."""
    return all(layer["kind"] in ("attention", "conv", "mlp") and "extra" not in layer
               for layer in spec.params["layers"])


def future_ratio(f, x) -> float:
    infl = am.influence_matrix(f, x)
    return float(infl.triu(1).max() / infl.max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_leaking_layer_is_the_one_built_without_causality(dtype, seed=5):
    """On every model the grader draws, the reference finds the construction's layer, and the
    margins around the 1e-3 threshold are wide both for prefixes and for single layers."""
    for call in specs_of("find_leaking_layer", seed):
        spec, x = call.args
        if not random_built(spec):
            continue
        model, x = build(spec), x.to(dtype)
        want = leak_at_of(spec)
        assert am.find_leaking_layer(model, x) == want
        h = x
        for k, layer in enumerate(model.layers):
            prefix = am.LayerStack(model.layers[:k + 1])
            for ratio in (future_ratio(prefix, x), future_ratio(layer, h)):
                if want is None or k < want:
                    assert ratio < 1e-5, (k, ratio)  # zero, or float noise
                elif k == want:
                    assert ratio > 1e-2, (k, ratio)  # a real leak
            h = layer(h)


@pytest.mark.parametrize("seed", [5, 11])
def test_the_special_models_hold_their_answer_with_margins_and_fool_layer_alone_measurement(seed):
    """Each hidden set ends with one model of every SPECIAL class. In float64 as in float32 the
    prefixes before the answer are at most float noise and the answer's prefix a real leak; in
    every set, measuring each layer alone at x answers some model wrong (a gate that the layers
    before open or close); every layer says it is causal."""
    from grader.checks.ch1_leakage import SPECIAL, _ratio

    sets = [c for c in EXERCISES["find_leaking_layer"].make_checks(seed, hidden=True)
            if c.requires is None and not c.public and c.kind == "value"]
    assert len(sets) == 3
    for check in sets:
        specials = check.calls[-len(SPECIAL):]
        fooled = 0
        for call in specials:
            spec, x = call.args
            model = build(spec)
            assert all(layer.causal is True for layer in model.layers)
            want = am.find_leaking_layer(model, x)
            layers = list(model.layers)
            for dtype in (torch.float32, torch.float64):
                xd = x.to(dtype)
                prefix = [_ratio(am.LayerStack(layers[:k + 1]), xd) for k in range(len(layers))]
                alone = [_ratio(layer, xd) for layer in layers]
                before = prefix if want is None else prefix[:want]
                assert all(r < 1e-5 for r in before), (spec.params["layers"], prefix)
                assert want is None or prefix[want] > 1e-2, prefix
            by_alone = next((k for k, r in enumerate(alone) if r > 1e-3), None)
            fooled += by_alone != want
        assert fooled >= 2


def test_fft_convolution_is_causal_up_to_float_noise():
    """What makes a zero threshold wrong: the causal convolution's future entries are tiny, not 0."""
    stack = dx.random_stack(["conv"], seed=3)
    x = torch.randn(8, 8)
    ratio = future_ratio(stack, x)
    assert 0 < ratio < 1e-5
    assert am.find_leaking_layer(stack, x) is None
    assert am.find_leaking_layer(dx.random_stack(["conv"], leak_at=0, seed=3), x) == 0


def test_fnspec_layer_stack_mirrors_attnmask():
    """The grader's sandbox-side copy computes what attnmask's layers compute."""
    gen = torch.Generator().manual_seed(0)
    D, L = 4, 6
    for kind in ("attention", "conv", "mlp"):
        for causal in (True, False):
            p = {k: torch.randn(D, D, generator=gen) for k in ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2")}
            p["filt"] = torch.randn(L, D, generator=gen)
            x = torch.randn(L, D, generator=gen)
            ours = dx.stack_layer(kind, p, causal)(x)
            theirs = build(am_spec(kind, causal, p))(x)
            torch.testing.assert_close(theirs, ours)


def am_spec(kind, causal, p):
    from grader.spec import FnSpec

    return FnSpec("layer_stack", {"layers": [{"kind": kind, "causal": causal, **p}]})


@pytest.mark.parametrize("seed", [0, 5])
def test_padding_leaks_exactly_for_the_leaking_styles(seed):
    """On every decoder the grader draws, the reference says True exactly when some layer's
    style leaks; the grader's copy equals attnmask's PaddedDecoder."""
    for call in specs_of("leaks_across_padding", seed):
        spec, tokens, lengths = call.args
        decoder = build(spec)
        p = spec.params
        mirror = dx.PaddedDecoder(p["emb"], p["pos"], p["layers"], p["head"], p["styles"],
                                  p.get("jitter", 0.0))
        torch.testing.assert_close(decoder(tokens, lengths), mirror(tokens, lengths))
        leaky = any(s not in dx.SAFE_STYLES for s in p["styles"])
        assert am.leaks_across_padding(decoder, tokens, lengths) is leaky, p["styles"]
        args, _ = cpu_args(call)  # the trusted side judges in float64: the same answer
        assert am.leaks_across_padding(*args) is leaky


def test_no_padding_no_leak_and_the_real_positions_are_the_last():
    decoder = dx.random_decoder(["no_padding"])
    tokens = torch.randint(0, 10, (3, 6))
    assert not am.leaks_across_padding(decoder, tokens, torch.tensor([6, 6, 6]))
    assert am.leaks_across_padding(decoder, tokens, torch.tensor([6, 2, 6]))
    assert dx.left_real(torch.tensor([2, 0]), 4).tolist() == [[False, False, True, True]] + [[False] * 4]


@pytest.mark.parametrize("seed", [0, 5, 29])
def test_every_padding_verdict_holds_on_any_cpu(seed):
    """Issue 49: a verdict near the tolerance can flip on another CPU. Every decoder the grader draws
    (the public ones too) moves its real outputs by at most 1/20 of the tolerance when it is correct
    and by 10 times it or more under every one of the reference's refillings when it leaks. A
    correct decoder with padding differs in its last bits by construction (jitter), not by a CPU's
    rounding, so a bit-exact test answers the same everywhere. Run it under
    ATEN_CPU_CAPABILITY=default and one thread as well."""
    from grader.checks.ch4_combined import changes

    for check in EXERCISES["leaks_across_padding"].make_checks(seed, hidden=True):
        for call in check.calls:
            spec, tokens, lengths = call.args
            p = spec.params
            leaky = any(s not in dx.SAFE_STYLES for s in p["styles"])
            least, greatest, _ = changes(call, trials=3 if leaky else 6)
            if leaky:
                assert least > 10, (p["styles"], least)
            else:
                assert greatest < 0.05, (p["styles"], greatest)
                noisy = any(s == "max_over_all" for s in p["styles"]) or p.get("jitter", 0.0) > 0
                assert not noisy or p.get("jitter", 0.0) > 0, "float noise must come from the jitter"
