"""Chapter 1, leakage: ``causal_mask`` and ``influence_matrix``."""

from __future__ import annotations

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..fnspecs import build
from ..mistakes import MISTAKES
from ..spec import Call, Check, FnSpec, exercise
from .common import answers as A
from .common import judges as J
from .common import properties as P

M = MISTAKES


# --------------------------------------------------------------------------- causal_mask

def square(args: tuple, kwargs: dict) -> tuple[int, int]:
    """Contract shape (n, n) of a builder whose first argument is n."""
    return (args[0], args[0])


def diagnose_causal(args, kwargs, got, index, dtype) -> str | None:
    ref = am.causal_mask(args[0])
    eye = torch.eye(args[0], dtype=torch.bool)
    return dg.name_mistake(got, [
        (M["diagonal_excluded"], lambda: ref & ~eye),  # before "inverted": the same for n = 1
        (M["inverted"], lambda: ~ref),
        (M["wrong_triangle"], lambda: ref.T),
        (M["no_mask"], lambda: torch.ones_like(ref)),
    ], dtype)


CAUSAL = J.Recipe("causal_mask", am.causal_mask, ("n",),
                  (J.Out("mask", "mask", "(n, n)", square),), diagnose_causal)


@exercise(1, "causal_mask(n, *, device=None): bool (n, n), True where key j <= query i.")
def causal_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    public = [("matches reference (n=4)", (4,)), ("a single token sees itself (n=1)", (1,))]
    # the second public case is degenerate (edge): any mask with a True passes it
    return P.int_mask_checks(CAUSAL, seed, hidden, public, [("n = 2", (2,))],
                             lambda gen: (cases.integer(gen, 3, 12),))


# --------------------------------------------------------------------------- influence_matrix

def attention_fn(gen: torch.Generator, d: int, causal: bool) -> FnSpec:
    w = lambda: cases.randn(gen, d, d, scale=0.7)  # noqa: E731
    return FnSpec("attention", {"w_q": w(), "w_k": w(), "w_v": w(), "causal": causal})


def mix_fn(gen: torch.Generator, L: int, d: int, d_out: int, scale: float = 1.0) -> FnSpec:
    return FnSpec("mix", {"a": cases.randn(gen, L, L, scale=scale),
                          "w": cases.randn(gen, d, d_out, scale=scale)})


def diagnose_influence(args, kwargs, got, index, dtype) -> str | None:
    f, x = args
    ref = am.influence_matrix(f, x)
    return dg.name_mistake(got, [
        ("the matrix is transposed: row i is the output position, column j the input position "
         "([i, j] = ||∂f(x)[i] / ∂x[j]||).", lambda: ref.T),
        ("the norms are squared: take the square root of the sum of squares (the Frobenius norm).",
         lambda: ref**2),
        ("the gradient of f(x)[i].sum() is not the Jacobian block: summing the outputs first lets "
         "components cancel. Differentiate every output component (e.g. torch.autograd.functional.jacobian).",
         lambda: grad_of_sum(f, x)),
        ("the block norm is the L1 norm (the sum of |entries|); the contract asks for the Frobenius norm, "
         "the square root of the sum of squares.", lambda: jacobian_blocks(f, x).abs().sum(dim=(-2, -1))),
        ("the block norm is the spectral norm (the largest singular value); the contract asks for the "
         "Frobenius norm, the square root of the sum of squares.",
         lambda: torch.linalg.matrix_norm(jacobian_blocks(f, x), ord=2)),
        ("the block norm is the largest |entry|; the contract asks for the Frobenius norm, the square root "
         "of the sum of squares.", lambda: jacobian_blocks(f, x).abs().amax(dim=(-2, -1))),
    ], dtype)


def jacobian_blocks(f, x: torch.Tensor) -> torch.Tensor:
    """(L, L, d_out, d): block [i, j] is ∂f(x)[i] / ∂x[j]."""
    jac = torch.autograd.functional.jacobian(f, x.detach())  # (L, d_out, L, d)
    return jac.permute(0, 2, 1, 3)


def grad_of_sum(f, x: torch.Tensor) -> torch.Tensor:
    """The mistaken [i, j] = ||∂ sum_k f(x)[i, k] / ∂x[j]||, for recognising it."""
    rows = []
    for i in range(x.shape[0]):
        xi = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(xi)[i].sum(), xi)
        rows.append(g.norm(dim=-1))
    return torch.stack(rows)


INFLUENCE = J.Recipe("influence_matrix", am.influence_matrix, ("f", "x"),
                     (J.Out("influence", "number", "(L, L)", dtype=lambda a, k: a[1].dtype),),
                     diagnose_influence, kept=(1,))


@exercise(2.5, "influence_matrix(f, x): for x (L, d), the (L, L) matrix of Frobenius norms ||∂f(x)[i] / "
          "∂x[j]||; x unchanged.")
def influence_matrix_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = INFLUENCE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "causal attention layer (L=4, d=3)",
                 [Call((attention_fn(pub, 3, True), cases.randn(pub, 4, 3)))], public=True),
        J.values(R, "token mixing A·x·W (L=3, d=2, d'=4)",
                 [Call((mix_fn(pub, 3, 2, 4), cases.randn(pub, 3, 2)))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    L, d = cases.integer(gen, 5, 8), cases.integer(gen, 2, 4)
    x = lambda dtype=torch.float32: cases.randn(gen, L, d, dtype=dtype)  # noqa: E731
    return checks + [
        J.values(R, "causal attention layer (random)", [Call((attention_fn(gen, d, True), x()))]),
        J.values(R, "attention layer without mask", [Call((attention_fn(gen, d, False), x()))]),
        J.values(R, "position-wise map → diagonal only",
                 [Call((FnSpec("elementwise", {"scale": 0.5 + float(torch.rand((), generator=gen))}), x()))]),
        J.values(R, "token mixing, d' ≠ d (random)", [Call((mix_fn(gen, L, d, d + 3), x()))]),
        J.values(R, "matches reference (float16 x)", [Call((mix_fn(gen, L, d, d), x(torch.float16)))]),
        # Jacobian entries above 256: their squares overflow float16 (65504), their norms do not.
        J.values(R, "float16 x whose Jacobian entries pass 256 (square in float32)",
                 [Call((mix_fn(gen, L, d, d, scale=24.0), x(torch.float16)))]),
        J.dtypes(R, "in x's dtype", [Call((mix_fn(gen, L, d, d), x(dt))) for dt in cases.FLOATS]),
        P.unchanged(R, "does not modify x", [Call((attention_fn(gen, d, True), x()))]),
        P.made_on_inputs_device(R, P.MADE_ON_INPUTS, [Call((attention_fn(gen, d, True), x()))]),
        P.on_cuda(R, "matches on CUDA", [Call((attention_fn(gen, d, True), x()))]),
    ]


# --------------------------------------------------------------------------- find_leaking_layer

#: The kinds of layer a hidden model is made of; only the first two can leak.
LAYER_KINDS = ("attention", "conv", "mlp")


def stack_layer_spec(gen: torch.Generator, kind: str, L: int, D: int, causal: bool) -> dict:
    """One layer of a ``layer_stack`` map (:mod:`grader.fnspecs`), its weights drawn from ``gen``."""
    w = lambda: cases.randn(gen, D, D, scale=0.8 / D**0.5)  # noqa: E731
    if kind == "attention":
        return {"kind": kind, "causal": causal, "w_q": w(), "w_k": w(), "w_v": w(), "w_o": w()}
    if kind == "conv":
        return {"kind": kind, "causal": causal, "filt": cases.randn(gen, L, D, scale=0.4)}
    return {"kind": kind, "causal": True, "w_1": w(), "w_2": w()}


def stack_spec(gen: torch.Generator, L: int, D: int, kinds: list[str], leak_at: int | None) -> FnSpec:
    """A ``layer_stack`` model whose layer ``leak_at`` (attention or conv) lost its causality."""
    return FnSpec("layer_stack", {"layers": [stack_layer_spec(gen, kind, L, D, k != leak_at)
                                             for k, kind in enumerate(kinds)]})


def random_stack(gen: torch.Generator, leaky: bool, *, telling: bool = False) -> Call:
    """One call of find_leaking_layer: a model of 3 to 5 layers (at least one FFT convolution,
    whose float noise a zero threshold takes for a leak), leaking at a random layer or not at all.

    ``telling``: a model on which the classic mistakes all answer differently (5 layers, layer 0
    an attention, the first convolution after the leak, leaking at layer 1 or clean), placed first
    in its check so that the first wrong answer names the right mistake."""
    L, D = cases.integer(gen, 4, 6), cases.integer(gen, 3, 5)
    if telling:
        kinds = ["attention", LAYER_KINDS[cases.integer(gen, 0, 2) if not leaky else 0], "mlp", "conv",
                 LAYER_KINDS[cases.integer(gen, 0, 2)]]
        return Call((stack_spec(gen, L, D, kinds, 1 if leaky else None), cases.randn(gen, L, D)))
    depth = cases.integer(gen, 3, 5)
    kinds = [LAYER_KINDS[cases.integer(gen, 0, 2)] for _ in range(depth)]
    kinds[cases.integer(gen, 0, depth - 1)] = "conv"
    leak_at = None
    if leaky:
        leak_at = cases.integer(gen, 0, depth - 1)
        if kinds[leak_at] == "mlp":
            kinds[leak_at] = LAYER_KINDS[cases.integer(gen, 0, 1)]
    return Call((stack_spec(gen, L, D, kinds, leak_at), cases.randn(gen, L, D)))


#: The classes of model that separate the statement's measurement (each prefix, a threshold
#: relative to the largest entry, every entry above the diagonal) from its shortcuts; every
#: hidden set holds one of each (:func:`special_stack`).
SPECIAL = ("scaled down, leaking", "scaled up, clean", "first layer ignores its input", "one-position leak",
           "leak opened by the layers before", "leak closed by the layers before")


def _random_layers(gen: torch.Generator, n: int, L: int, D: int, leak_at: int | None = None) -> list[dict]:
    """``n`` random attention / conv / mlp layers, the one at ``leak_at`` (made attention or conv)
    without its causality."""
    kinds = [LAYER_KINDS[cases.integer(gen, 0, 2)] for _ in range(n)]
    if leak_at is not None and kinds[leak_at] == "mlp":
        kinds[leak_at] = LAYER_KINDS[cases.integer(gen, 0, 1)]
    return [stack_layer_spec(gen, kind, L, D, k != leak_at) for k, kind in enumerate(kinds)]


def _gated_spec(gen: torch.Generator, L: int, D: int) -> dict:
    """A ``gated`` layer (:mod:`grader.fnspecs`) whose threshold is set later."""
    return {"kind": "gated", "a": cases.randn(gen, L, L), "g": cases.randn(gen, D),
            "u": cases.randn(gen, D, scale=0.5), "theta": 0.0}


def _gate_peak(g: torch.Tensor, h: torch.Tensor) -> float:
    """The largest gate input ``h[j] . g`` over the positions j >= 1 (the ones with a past to leak into)."""
    return float((h[1:] @ g).max())


def _ratio(f, x: torch.Tensor) -> float:
    """The largest influence above the diagonal of ``f`` at ``x`` over the largest (0 where every
    influence is 0)."""
    infl = am.influence_matrix(f, x)
    top = float(infl.max())
    return float(infl.triu(1).max()) / top if top > 0 else 0.0


def _clear(layers: list, x: torch.Tensor, want: int | None) -> bool:
    """Whether the answer ``want`` holds with wide margins around the 1e-3 threshold: the prefixes
    of ``layers`` before it at most float noise (1e-5), the one that ends at it a real leak (1e-2).
    Measured prefix by prefix, up to the first that decides."""
    for k in range(len(layers) if want is None else want + 1):
        r = _ratio(am.LayerStack(layers[:k + 1]), x)
        if k == want:
            return r > 1e-2
        if r >= 1e-5:
            return False
    return True


def special_stack(gen: torch.Generator, which: str) -> Call:
    """One model of the class ``which`` (:data:`SPECIAL`), redrawn until its answer holds with wide
    margins (and, for the gated ones, until layer-alone measurement at x answers otherwise)."""
    for _ in range(200):
        L, D = cases.integer(gen, 4, 5), cases.integer(gen, 2, 3)
        x = cases.randn(gen, L, D)
        want: int | None = None
        if which == "scaled down, leaking":  # a relative threshold scales; an absolute or divided one not
            n = cases.integer(gen, 2, 3)
            want = 1 + cases.integer(gen, 0, n - 1)
            layers = [{"kind": "scale", "c": 1e-4}] + _random_layers(gen, n, L, D, want - 1)
        elif which == "scaled up, clean":  # float noise of a convolution, times 1e6
            layers = _random_layers(gen, cases.integer(gen, 1, 2), L, D)
            layers.insert(cases.integer(gen, 0, len(layers)), stack_layer_spec(gen, "conv", L, D, True))
            layers.append({"kind": "scale", "c": 1e6})
        elif which == "first layer ignores its input":  # every influence is 0: nothing leaks, and 0 >= 0
            # the layers after it are causal: a leaking one would leak on its own input while the
            # model's output, constant in x, never does; the statement's prefixes and measuring each
            # layer on what reaches it (a correct reading) then disagree, which no check may judge
            layers = ([{"kind": "const", "bias": cases.randn(gen, L, D)}]
                      + _random_layers(gen, cases.integer(gen, 2, 3), L, D))
        elif which == "one-position leak":  # one entry above the diagonal, next to it
            n = cases.integer(gen, 2, 4)
            layers = _random_layers(gen, n, L, D)
            want = cases.integer(gen, 0, n - 1)
            layers[want] = stack_layer_spec(gen, "attention", L, D, True)
            layers[want]["extra"] = cases.integer(gen, 0, L - 2)
        else:  # gated: what reaches the layer opens or closes its leak
            opens = which == "leak opened by the layers before"
            layers = _random_layers(gen, cases.integer(gen, 0 if not opens else 1, 2), L, D)
            layers.append({"kind": "scale", "c": 5.0 if opens else 0.1})
            gated = _gated_spec(gen, L, D)
            h = build(FnSpec("layer_stack", {"layers": layers}))(x)  # what reaches the gated layer
            alone, reached = _gate_peak(gated["g"], x), _gate_peak(gated["g"], h)
            if abs(reached - alone) < 1.0:  # the gate's margin: 0.5 either side of theta
                continue
            gated["theta"] = (alone + reached) / 2
            if opens:
                want = len(layers)
                layers += [gated] + _random_layers(gen, cases.integer(gen, 0, 1), L, D)
            else:
                n = cases.integer(gen, 1, 2)
                leak = cases.integer(gen, 0, n) if cases.integer(gen, 0, 1) else None
                want = None if leak is None or leak == n else len(layers) + 1 + leak
                layers += [gated] + _random_layers(gen, n, L, D, None if want is None else leak)
        spec = FnSpec("layer_stack", {"layers": layers})
        model = build(spec)
        if not _clear(model.layers, x, want):
            continue
        gated_at = next((k for k, layer in enumerate(layers) if layer["kind"] == "gated"), None)
        if gated_at is not None:  # the gated layer measured alone at x answers otherwise, by a margin
            alone = _ratio(model.layers[gated_at], x)
            if (alone > 1e-2) == (which == "leak opened by the layers before") or 1e-5 <= alone <= 1e-2:
                continue
        return Call((spec, x))
    raise RuntimeError(f"no {which!r} model with wide margins in 200 draws")


def first_leak(model, x: torch.Tensor, rule) -> int | None:
    """The first k for which ``rule(influence of layers[:k + 1])`` holds: the mistakes' searches."""
    for k in range(len(model.layers)):
        if rule(am.influence_matrix(am.LayerStack(model.layers[:k + 1]), x)):
            return k
    return None


def leak_answer(k: int | None) -> torch.Tensor:
    return torch.tensor(-1 if k is None else k)


def diagnose_leaking_layer(args, kwargs, got, index, dtype) -> str | None:
    model, x = args
    ref = am.find_leaking_layer(model, x)
    n = len(model.layers)
    tol = am.LEAK_TOL
    return dg.name_mistake(got, [
        (M["leak_layer_after"], lambda: leak_answer(None if ref is None else ref + 1)),
        (M["leak_whole_model"], lambda: leak_answer(None if ref is None else n - 1)),
        (M["leak_zero_threshold"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.triu(1) > 0).any())))),
        (M["leak_lower_triangle"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.tril(-1) > tol * i.max()).any())))),
        (M["leak_layer_alone"], lambda: leak_answer(next(
            (k for k, layer in enumerate(model.layers) if am.diagnosis.leaks(am.influence_matrix(layer, x))),
            None))),
        (M["leak_threshold_divided"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.triu(1) > tol / i.max()).any())))),
        (M["leak_threshold_divided"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.triu(1) > tol).any())))),
        (M["leak_zero_matrix"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.triu(1) >= tol * i.max()).any())))),
        (M["leak_one_position"],
         lambda: leak_answer(first_leak(model, x, lambda i: bool((i.triu(2) > tol * i.max()).any())))),
    ], dtype)


LEAKING = J.Recipe("find_leaking_layer", lambda model, x: leak_answer(am.find_leaking_layer(model, x)),
                   ("model", "x"), (J.Out("answer", "answer", "()"),), diagnose_leaking_layer, kept=(1,))


def leaking_check(name: str, calls: list[Call], *, public: bool = False, edge: bool = False) -> Check:
    return Check(name, calls, A.answers_judge(LEAKING, "index", "the leaking layer"), public=public,
                 kind="edge" if edge else "value")


def public_stacks() -> list[Call]:
    """Four fixed models of 4 layers (L = 4, D = 3: cheap enough for a loaded machine): clean, leaking at
    layer 0, at layer 2 (a convolution), at the last."""
    gen = cases.generator(cases.PUBLIC_SEED, "find_leaking_layer")
    kinds = ["attention", "conv", "mlp", "attention"]
    return [Call((stack_spec(gen, 4, 3, k, leak), cases.randn(gen, 4, 3)))
            for k, leak in ((kinds, None), (kinds, 0), (["attention", "mlp", "conv", "attention"], 2),
                            (kinds, 3))]


@exercise(3.5, "find_leaking_layer(model, x): the index of the first layer of model.layers at which the "
          "output starts to depend on a later position (measured with influence_matrix, an entry above the "
          "diagonal > 1e-3 x the largest), or None.")
def find_leaking_layer_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    pub = public_stacks()
    # public: guessable alone (a few answers), so they count as edge cases
    checks = [leaking_check("a clean model and one leaking at layer 0 (4 layers)", pub[:2], public=True,
                            edge=True),
              leaking_check("leaks at layer 2 (a circular convolution), at the last layer", pub[2:],
                            public=True, edge=True)]
    if not hidden:
        return checks
    checks.append(P.unchanged(LEAKING, "does not modify x", pub[1:2]))  # run publicly (with_public_rules)
    gen = cases.generator(seed, "find_leaking_layer")
    for c in ("first", "second", "third"):
        # 5 random models of 3 to 5 layers (2 clean), then one of each SPECIAL class: a blind guess
        # passes once in 2**20 tries or less, and each shortcut of the measurement fails every set
        calls = ([random_stack(gen, leaky=i >= 2, telling=i in (0, 2)) for i in range(5)]
                 + [special_stack(gen, which) for which in SPECIAL])
        checks.append(leaking_check(f"random models, then scaled ones, gated ones and a one-position leak "
                                    f"({c} set)", calls))
    on_gpu = [Call(c.args, {}, "cuda") for c in (random_stack(gen, False), random_stack(gen, True))]
    checks.append(Check("a clean and a leaking model, x on CUDA", on_gpu,
                        A.answers_judge(LEAKING, "index", "the leaking layer"), requires="cuda", kind="edge"))
    return checks
