"""Chapter 4, causal AND padding: ``decoder_mask``.

:func:`decoder_mistakes` recognises the classic mistakes of combining a
causal mask with key padding; chapter 5 reuses it for the decoder's
self-attention mask.
"""

from __future__ import annotations

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..fnspecs import build
from ..mistakes import MISTAKES
from ..spec import Call, Check, FnSpec, exercise
from .ch3_padding import lengths_mask_checks
from .common import answers as A
from .common import default_device as DD
from .common import judges as J
from .common import properties as P

M = MISTAKES


def decoder_mistakes(lengths: torch.Tensor, L: int) -> list[dg.Candidate]:
    """What the classic decoder-mask mistakes return, as (B, 1, L, L) masks."""
    B = lengths.shape[0]
    causal = am.causal_mask(L)  # (L, L)
    real = am.padding_mask(lengths, L)  # (B, L)
    keys, rows = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, L), (B, 1, L, 1)
    eye = torch.eye(L, dtype=torch.bool)
    full = lambda m: m.expand(B, 1, L, L)  # noqa: E731
    return [
        (M["inverted"], lambda: ~am.decoder_mask(lengths, L)),
        (M["unreshaped_padding"], lambda: full(causal & real)),  # (L, L) & (B, L): only when B = L
        # causal & rows == causal & rows & keys: the message says so, and fits both
        (M["rows_padded_too"], lambda: full(causal & rows)),
        (M["no_padding"], lambda: full(causal[None, None])),
        (M["no_causal"], lambda: full(keys)),
        (M["diagonal_excluded"], lambda: full(causal & ~eye & keys)),
        (M["wrong_triangle"], lambda: full(causal.T & keys)),
        (M["padding_off_by_one"],
         lambda: full(causal & am.padding_mask(lengths + 1, L + 1)[:, None, None, :L])),
    ]


def diagnose_decoder(args, kwargs, got, index, dtype) -> str | None:
    lengths, L = args
    return dg.name_mistake(got, decoder_mistakes(lengths, L), dtype)


def decoder_shape(args: tuple, kwargs: dict) -> tuple[int, ...]:
    return (args[0].shape[0], 1, args[1], args[1])


DECODER = J.Recipe("decoder_mask", am.decoder_mask, ("lengths", "max_len"),
                   (J.Out("mask", "mask", "(B, 1, L, L)", decoder_shape),), diagnose_decoder)


@exercise(1.5, "decoder_mask(lengths, max_len): broadcasts to (B, 1, L, L): causal AND key position < "
          "lengths[b]; padded query rows are not masked.")
def decoder_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = DECODER
    checks = [
        J.values(R, "lengths [2, 4], max_len 4", [Call((torch.tensor([2, 4]), 4))], public=True),
        J.values(R, "length 0 and length = max_len", [Call((torch.tensor([5, 0]), 5))], public=True),
        # B = L: a (B, L) table used without its axes broadcasts silently (chapter 3)
        J.values(R, "B = L = 3: lengths [1, 3, 2], max_len 3", [Call((torch.tensor([1, 3, 2]), 3))],
                 public=True),
    ]
    if not hidden:
        return checks
    one_token = J.values(R, "one token (max_len = 1)", [Call((torch.tensor([1, 0, 1]), 1))], edge=True)
    return checks + lengths_mask_checks(R, seed, (2, 4), (3, 10), (one_token,))


# --------------------------------------------------------------------------- leaks_across_padding

#: Mask styles of the hidden decoders (:mod:`grader.fnspecs`, ``padded_decoder``), per layer.
SAFE = (("correct",), ("finfo_min",), ("correct", "finfo_min"))
NOISY = (("max_over_all",), ("correct", "max_over_all"))  # correct, up to float noise (and JITTER)
LEAKY = (("no_padding",), ("after_softmax",), ("wrong_sign",), ("wrong_side",), ("correct", "no_padding"),
         ("finfo_min", "after_softmax"))
#: The styles that leak.
LEAKING = ({style for styles in LEAKY for style in styles} - {"correct", "finfo_min"}
           | {"soft", "window", "sink"})


#: The relative change a noisy correct decoder makes at real positions as the pads change: float
#: noise of a known size (a hundredth of rtol), so that it differs in its last bits on every CPU
#: and stays within the tolerance on every CPU.
JITTER = 1e-6


def decoder_spec(gen: torch.Generator, styles: tuple[str, ...], V: int, D: int, L: int, *,
                 jitter: float = 0.0, head_scale: float = 1.0) -> FnSpec:
    """A ``padded_decoder`` whose attention layers mask as ``styles`` say."""
    w = lambda: cases.randn(gen, D, D, scale=1.0 / D**0.5)  # noqa: E731
    layers = [{"w_q": w(), "w_k": w(), "w_v": w(), "w_1": w(), "w_2": w()} for _ in styles]
    return FnSpec("padded_decoder", {"emb": cases.randn(gen, V, D), "pos": cases.randn(gen, L, D, scale=0.5),
                                     "head": cases.randn(gen, D, V, scale=head_scale / D**0.5),
                                     "layers": layers, "styles": list(styles), "jitter": jitter})


def padded_batch(gen: torch.Generator, V: int, full_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, L) and lengths (B,) of a left-padded batch: every row has a real token, some row
    has padding; row 0 is full when ``full_first``, padded otherwise."""
    B, L = cases.integer(gen, 2, 4), cases.integer(gen, 5, 8)
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    lengths[0] = L if full_first else cases.integer(gen, 1, L - 1)
    lengths[-1] = cases.integer(gen, 1, L - 1)
    return torch.randint(0, V, (B, L), generator=gen), lengths


def decoder_call(gen: torch.Generator, styles: tuple[str, ...], full_first: bool) -> Call:
    V, D = cases.integer(gen, 6, 12), cases.integer(gen, 4, 8)
    tokens, lengths = padded_batch(gen, V, full_first)
    noisy = any(style not in ("correct", "finfo_min") for style in styles) and not set(styles) & LEAKING
    return Call((decoder_spec(gen, styles, V, D, tokens.shape[1], jitter=JITTER if noisy else 0.0),
                 tokens, lengths))


#: The decoders that separate the statement's test from its shortcuts; the hidden set holds one of
#: each (:func:`special_decoder`).
SPECIAL = ("a small leak", "correct, large outputs", "leaks unless a pad keeps its embedding",
           "odd V, the pads hold the middle id", "the pads hold token 0",
           "a leak that misses the last position",
           "a leak from the first pad only")


def changes(call: Call, trials: int = 3) -> tuple[float, float, float]:
    """How the real outputs move under the reference's refillings, as the largest |change| /
    (atol + rtol |old|) of a refilling: (its smallest over the trials, its largest over the trials,
    the largest |change| itself)."""
    decoder, tokens, lengths = build(call.args[0]), call.args[1], call.args[2]
    real = am.diagnosis.left_real(lengths, tokens.shape[1])
    base = decoder(tokens, lengths)[real]
    rng = torch.Generator().manual_seed(0)
    V, least, greatest, most = decoder.vocab_size, float("inf"), 0.0, 0.0
    for _ in range(trials):
        shift = torch.randint(1, V, tokens.shape, generator=rng)
        out = decoder(torch.where(real, tokens, (tokens + shift) % V), lengths)[real]
        moved = (out - base).abs()
        allowed = am.diagnosis.PAD_ATOL + am.diagnosis.PAD_RTOL * base.abs()
        ratio = float((moved / allowed).max())
        least, greatest, most = min(least, ratio), max(greatest, ratio), max(most, float(moved.max()))
    return least, greatest, most


def special_decoder(gen: torch.Generator, which: str) -> Call:
    """One decoder and batch of the class ``which`` (:data:`SPECIAL`), redrawn until its answer
    holds with a margin of 100 either side of the tolerance."""
    for _ in range(200):
        V, D = cases.integer(gen, 6, 12), cases.integer(gen, 4, 8)
        tokens, lengths = padded_batch(gen, V, False)
        L = tokens.shape[1]
        pads = ~am.diagnosis.left_real(lengths, L)
        styles, leaky, jitter, head = ("no_padding",), True, 0.0, 1.0
        if which == "a small leak":  # moves real outputs by about 1e-2: an atol of 1 misses it
            styles = ("soft",)
        elif which == "correct, large outputs":  # float noise of outputs near 1e4: no rtol, no pass
            styles, leaky, jitter, head = SAFE[cases.integer(gen, 0, len(SAFE) - 1)], False, JITTER, 1e4
        elif which == "leaks unless a pad keeps its embedding":  # ids 2m, 2m + 1 share an embedding
            even = 2 * torch.randint(0, (V - 1) // 2, tokens.shape, generator=gen)
            tokens = torch.where(pads, even, tokens)
        elif which == "odd V, the pads hold the middle id":
            V += 1 - V % 2
            tokens = torch.where(pads, torch.full_like(tokens, (V - 1) // 2), tokens % V)
        elif which == "the pads hold token 0":
            tokens = torch.where(pads, torch.zeros_like(tokens), tokens)
        elif which == "a leak that misses the last position":  # a window of 2; 2 real tokens or more
            lengths = lengths.clamp(min=2)
            styles = ("window",)
        else:  # an attention sink at position 0: only the first pad leaks; 2 pads or more where any
            lengths = torch.where(lengths < L, lengths.clamp(max=L - 2), lengths)
            styles = ("sink",)
        if not bool((lengths < L).any()):
            continue
        spec = decoder_spec(gen, styles, V, D, L, jitter=jitter, head_scale=head)
        if which == "leaks unless a pad keeps its embedding":
            spec.params["emb"][1::2] = spec.params["emb"][0:V - V % 2:2]
        call = Call((spec, tokens, lengths))
        least, greatest, most = changes(call, trials=3 if leaky else 6)
        if leaky and least > 100 and (which != "a small leak" or most < 0.1):
            return call
        if not leaky and greatest < 0.05 and most > 1e-3:
            return call
    raise RuntimeError(f"no {which!r} decoder with a margin of 100 in 200 draws")


def refill_search(decoder, tokens, lengths, refill, compare, trials: int = 3, *, ids=None) -> bool:
    """The mistakes' tests: True when ``compare(out, base, real)`` finds a change after the
    positions ``refill`` (bool (B, L)) get other tokens: random other ids, or ``ids(tokens)`` (one
    fixed refilling, tried once)."""
    base = decoder(tokens, lengths)
    real = am.diagnosis.left_real(lengths, tokens.shape[1])
    gen = torch.Generator().manual_seed(0)
    V = decoder.vocab_size
    for _ in range(1 if ids is not None else trials):
        shift = torch.randint(1, V, tokens.shape, generator=gen)
        other = ids(tokens) if ids is not None else (tokens + shift) % V
        out = decoder(torch.where(refill(real), other, tokens), lengths)
        if compare(out, base, real):
            return True
    return False


def padding_mistakes(decoder, tokens, lengths) -> list[tuple[str, bool]]:
    """What each classic mistake of the padding test answers, as (message, answer)."""
    B, L = tokens.shape
    V = decoder.vocab_size
    rtol, atol = am.diagnosis.PAD_RTOL, am.diagnosis.PAD_ATOL
    close = lambda a, b: torch.allclose(a, b, rtol=rtol, atol=atol)  # noqa: E731
    right_pad = torch.arange(L) >= lengths[:, None]  # what a right-padding reading calls padding
    nearest = torch.arange(L) == (L - lengths - 1)[:, None]  # the pad next to the real tokens

    def pads(r):
        return ~r

    def real_moved(o, b, r):
        return not close(o[r], b[r])

    def moved_beyond(rtol_, atol_):
        return lambda o, b, r: not torch.allclose(o[r], b[r], rtol=rtol_, atol=atol_)

    tests = [
        (M["pad_fixed_refill"], lambda: refill_search(decoder, tokens, lengths, pads, real_moved,
                                                      ids=lambda t: (t + 1) % V)),
        (M["pad_fixed_refill"], lambda: refill_search(decoder, tokens, lengths, pads, real_moved,
                                                      ids=lambda t: V - 1 - t)),
        (M["pad_fixed_refill"], lambda: refill_search(decoder, tokens, lengths, pads, real_moved,
                                                      ids=torch.zeros_like)),
        (M["pad_loose_tolerance"], lambda: refill_search(decoder, tokens, lengths, pads,
                                                         moved_beyond(rtol, 1.0))),
        (M["pad_last_position"], lambda: refill_search(decoder, tokens, lengths, pads,
                                                       lambda o, b, r: not close(o[:, -1], b[:, -1]))),
        (M["pad_nearest_only"], lambda: refill_search(decoder, tokens, lengths, lambda r: nearest,
                                                      real_moved)),
        (M["pad_exact"], lambda: refill_search(decoder, tokens, lengths, pads,
                                               lambda o, b, r: not torch.equal(o[r], b[r]))),
        (M["pad_exact"], lambda: refill_search(decoder, tokens, lengths, pads, moved_beyond(0.0, atol))),
        (M["pad_all_positions"], lambda: refill_search(decoder, tokens, lengths, pads,
                                                       lambda o, b, r: not close(o, b))),
        (M["pad_first_row"], lambda: refill_search(decoder, tokens, lengths, pads,
                                                   lambda o, b, r: not close(o[0][r[0]], b[0][r[0]]))),
        # last: on a causal decoder it answers False whatever the mask, so it fits any missed leak
        (M["pad_right_side"], lambda: refill_search(decoder, tokens, lengths, lambda r: right_pad,
                                                    lambda o, b, r: not close(o[~right_pad], b[~right_pad]))),
    ]
    out = []
    for message, test in tests:
        try:
            out.append((message, bool(test())))
        except Exception:  # noqa: BLE001,S112 -- a recogniser that cannot apply just does not match
            continue
    return out


def diagnose_padding(args, kwargs, got, index, dtype) -> str | None:
    """The classic mistake behind a wrong answer: the first of :func:`padding_mistakes`, most
    specific first, that answers as the student did where the reference answers otherwise."""
    decoder, tokens, lengths = args
    want = am.leaks_across_padding(decoder, tokens, lengths)
    named = [(m, a) for m, a in padding_mistakes(decoder, tokens, lengths) if a != want]
    return dg.name_mistake(got, [(m, lambda a=a: torch.tensor(int(a))) for m, a in named], dtype)


def padding_answer(decoder, tokens, lengths) -> torch.Tensor:
    return torch.tensor(int(am.leaks_across_padding(decoder, tokens, lengths)))


PADDING = J.Recipe("leaks_across_padding", padding_answer,
                   ("decoder", "tokens", "lengths"), (J.Out("answer", "answer", "()"),), diagnose_padding)


def padding_check(name: str, calls: list[Call], *, public: bool = False, edge: bool = False) -> Check:
    return Check(name, calls, A.answers_judge(PADDING, "bool", "whether it leaks"), public=public,
                 kind="edge" if edge else "value")


def decoder_set(gen: torch.Generator, n_safe: int, n_noisy: int, n_leaky: int) -> list[Call]:
    """Correct decoders first, then the noisy correct ones, then leaking ones (those whose first
    row has padding before those whose first row is full): the first wrong answer of each classic
    mistake is then one that only it gives."""
    pick = lambda styles: styles[cases.integer(gen, 0, len(styles) - 1)]  # noqa: E731
    return ([decoder_call(gen, pick(SAFE), cases.integer(gen, 0, 1) == 1) for _ in range(n_safe)]
            + [decoder_call(gen, pick(NOISY), cases.integer(gen, 0, 1) == 1) for _ in range(n_noisy)]
            + [decoder_call(gen, pick(LEAKY), i >= n_leaky // 2) for i in range(n_leaky)])


@exercise(3, "leaks_across_padding(decoder, tokens, lengths): True when an output of decoder at a real "
          "position of the left-padded batch changes (beyond rtol 1e-4, atol 1e-5) as the padding tokens "
          "change, else False.")
def leaks_across_padding_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    pub = cases.generator(cases.PUBLIC_SEED, "leaks_across_padding")
    calls = [decoder_call(pub, ("correct",), True), decoder_call(pub, ("no_padding",), False),
             decoder_call(pub, ("max_over_all",), False), decoder_call(pub, ("correct", "no_padding"), False)]
    checks = [
        padding_check("a correct decoder and one with no padding mask", calls[:2], public=True, edge=True),
        padding_check("correct up to float noise; only the second layer leaks", calls[2:], public=True,
                      edge=True),
    ]
    if not hidden:
        return checks
    checks.append(P.unchanged(PADDING, "does not modify tokens or lengths", calls[:1]))  # run publicly
    leaks = DD.default_device_answers_judge(PADDING, "bool", "whether it leaks")
    checks.append(P.made_on_inputs_device(PADDING, P.MADE_ON_INPUTS, calls[:1], leaks))
    gen = cases.generator(seed, "leaks_across_padding")
    # 24 random decoders, each answered right by a blind guess half the time (1 in 2**24 passes them
    # all), then one of each SPECIAL class, which a shortcut of the test answers wrong
    calls = decoder_set(gen, 8, 4, 12) + [special_decoder(gen, which) for which in SPECIAL]
    checks.append(padding_check("random decoders, then small leaks, large outputs, leaks that need the "
                                "right refilling", calls))
    on_gpu = [Call(c.args, {}, "cuda") for c in decoder_set(gen, 1, 0, 1)]
    checks.append(Check("a correct and a leaking decoder, on CUDA", on_gpu,
                        A.answers_judge(PADDING, "bool", "whether it leaks"), requires="cuda", kind="edge"))
    return checks
