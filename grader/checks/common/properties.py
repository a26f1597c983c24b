"""Judges and check factories for the properties beyond values, shared by every chapter.

Each takes a :class:`~grader.checks.common.judges.Recipe` and judges one property of the
student's outcomes: on ``device`` (meta by default), the outputs' device, dtype
and shape (:func:`on_device`); on CUDA, results that match the reference and the
student's own CPU result (:func:`on_cuda`); tensor inputs left as they were
(:func:`unchanged`); gradients that exist, are finite and match the reference's,
computed here in float64 (:func:`gradients`). :func:`int_mask_checks` gives the
hidden checks of a builder from integers, its values and dtype included.
"""

from __future__ import annotations

import torch

from ... import cases, errors
from ... import diagnose as dg
from ...mistakes import MISTAKES
from ...spec import Call, Check, Verdict
from .default_device import then
from .judges import (
    Recipe,
    cpu_args,
    dtypes,
    fit,
    float_dtype,
    guessable,
    inputs_of,
    judge_call,
    raised,
    rebuildable,
    recall,
    reference,
    values,
)
from .nan_reasons import NAN_REASONS  # noqa: F401 -- the template reads them here

# --------------------------------------------------------------------------- judging properties

@rebuildable
def device_judge(recipe: Recipe, device: str, vectorised: bool = True):
    """Every output on ``device`` with the contract's dtype and shape (values unread).

    With ``vectorised=False``, code that reads values back (``if mask.all():``)
    is allowed: on the meta device that raises, and the check then cannot tell.
    """

    def judge(calls, outcomes):
        for call, outcome in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            omitted = recipe.arg_names[len(call.args):]
            if outcome.error is not None:
                if not vectorised and errors.reads_values(outcome.error):
                    continue
                if omitted and errors.mixes_devices(outcome.error):
                    return dg.fail(MISTAKES["default_device"] + f" (left out: {', '.join(omitted)}; "
                                   f"it raised {errors.quoted(outcome.error)})",
                                   f"inputs on {device}: {inputs}")
                return raised(outcome.error, inputs, device)
            got, msg = dg.unpack(outcome.output, recipe.out_names)
            if msg:
                return dg.fail(msg)
            devices = outcome.devices if isinstance(outcome.devices, tuple | list) else (outcome.devices,)
            args, kwargs = cpu_args(call)
            want = reference(recipe, call)
            for i, (out, g) in enumerate(zip(recipe.outs, got)):
                dev = devices[i] if i < len(devices) else None
                if dev != device:
                    why = MISTAKES["default_device" if omitted else "wrong_device"]
                    return dg.fail(f"{out.name} is on {dev}; expected {device} — " + why,
                                   f"inputs on {device}: {inputs}")
                kind_dtype = out.expected_dtype(call, *cpu_args(call, wide=False))
                if kind_dtype is not None and g.dtype != kind_dtype:
                    return dg.fail(f"{out.name} is {dg.dtype_str(g.dtype)}; "
                                   f"expected {dg.dtype_str(kind_dtype)}")
                shape = out.shape(args, kwargs) if out.shape else tuple(want[i].shape)
                _, msg = dg.fit_shape(g, shape, out.name, out.letters, exact=out.kind != "mask")
                if msg:
                    return dg.fail(msg, f"inputs on {device}: {inputs}")
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def default_device_judge(recipe: Recipe):
    """Calls run with the default device moved (:mod:`.default_device`): outputs on the CPU with the
    contract's dtype and shape (values unread)."""
    return then(recipe.out_names, lambda c: inputs_of(recipe, c), device_judge(recipe, "cpu", True))


#: The name of the check :func:`made_on_inputs_device` makes, in every exercise that has one.
MADE_ON_INPUTS = "made on the inputs' device, not PyTorch's default one"


def device_checks(recipe: Recipe, name: str, calls: list[Call], *, vectorised: bool = True) -> list[Check]:
    """:func:`on_device` on ``meta`` for ``calls``, and :func:`made_on_inputs_device` for the same
    calls with CPU inputs and the default device moved to ``meta``."""
    return [on_device(recipe, name, calls, vectorised=vectorised),
            made_on_inputs_device(recipe, MADE_ON_INPUTS, calls)]


def made_on_inputs_device(recipe: Recipe, name: str, calls: list[Call], judge=None) -> Check:
    """The class "a tensor made on the default device", caught on a CPU-only machine: each call runs
    with CPU inputs inside ``with torch.device("meta"):``; ``judge`` (default: outputs on the CPU
    with the contract's dtypes and shapes, :func:`default_device_judge`) judges the outcomes."""
    moved = [Call(c.args, dict(c.kwargs), "cpu", c.allocations, default_device="meta") for c in calls]
    return Check(name, moved, judge or default_device_judge(recipe), kind="property")


@rebuildable
def unchanged_judge(recipe: Recipe):
    def judge(calls, outcomes):
        for call, outcome in zip(calls, outcomes):
            if outcome.error is not None:
                return raised(outcome.error, inputs_of(recipe, call))
            after = outcome.args_after
            if not isinstance(after, tuple | list) or len(after) != len(call.args):
                return dg.fail("the inputs after the call were not recorded")
            kept = recipe.kept if recipe.kept is not None else range(len(call.args))
            for i in kept:
                before = call.args[i]
                if not isinstance(before, torch.Tensor):
                    continue
                name = recipe.arg_names[i]
                rec = after[i]
                if not isinstance(rec, dict) or not isinstance(rec.get("value"), torch.Tensor):
                    return dg.fail(f"{name} after the call was not recorded")
                value = rec["value"]
                if value.shape != before.shape or value.dtype != before.dtype or not torch.equal(
                        value.nan_to_num(0.123), before.nan_to_num(0.123)):
                    return dg.fail(f"{name} was modified: " + MISTAKES["in_place"],
                                   f"inputs: {inputs_of(recipe, call)}")
                if rec.get("grad_set"):
                    return dg.fail(f"{name}.grad was set: compute gradients with torch.autograd.grad "
                                   "(or on a detached copy) instead of calling .backward() on the inputs")
                if rec.get("requires_grad_changed"):
                    return dg.fail(f"{name}.requires_grad was changed: differentiate a detached copy "
                                   "(x.detach().clone().requires_grad_()) instead of the input itself")
        return dg.PASS

    return dg.judged(judge)


def reference_grads(recipe: Recipe, call: Call) -> dict[int, torch.Tensor | None]:
    """:func:`grads_of` the reference, remembered for a class (see :func:`judges.remember`)."""
    return recall(recipe, call, grads_of)


def grads_of(recipe: Recipe, call: Call) -> dict[int, torch.Tensor | None]:
    """:meth:`Recipe.expected_grads`, as a function of both (what :func:`judges.remember` keeps)."""
    return recipe.expected_grads(call)


@rebuildable(names_mistakes=True)
def grads_judge(recipe: Recipe, nan_why: str | None = None):
    """Gradients exist, are finite, and (float32 calls) match the reference's. ``nan_why``: what a
    NaN or inf gradient means for this exercise (default: the masked softmax's, :data:`MISTAKES`)."""

    def judge(calls, outcomes):
        for call, outcome in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            if outcome.error is not None:
                return raised(outcome.error, inputs)
            grads = outcome.grads
            if not isinstance(grads, dict):
                return dg.fail("no gradients were recorded", f"inputs: {inputs}")
            if "error" in grads:
                return dg.fail(f"the backward pass failed: {grads['error']}"[:300]
                               + " — every output must come from differentiable torch operations "
                                 "(no .detach(), torch.no_grad() or .item())", f"inputs: {inputs}")
            want = reference_grads(recipe, call)
            dtype = float_dtype(call)
            for i, w in want.items():
                name = recipe.arg_names[i]
                g = grads.get(i)
                if g is None:
                    if w is not None and bool((w != 0).any()):
                        return dg.fail(f"no gradient reaches {name}: every output must come from "
                                       "differentiable torch operations on the inputs", f"inputs: {inputs}")
                    continue
                if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(call.args[i].shape):
                    return dg.fail(f"the gradient of {name} is {dg.describe(g)}; "
                                   f"expected the shape of {name}")
                if not bool(torch.isfinite(g).all()):
                    why = nan_why or MISTAKES["nan_grads"]
                    return dg.fail(f"the gradient of {name} has NaN or infinite entries: " + why,
                                   f"inputs: {inputs}")
                # float32 gradients go through a few more roundings than the outputs:
                # judge them at the float16 tolerance.
                if dtype == torch.float32 and w is not None and bool(
                        dg.bad_entries(g, w, GRAD_TOL).any()):
                    wrong = judge_call(recipe, call, outcome)
                    why = (f"because the outputs differ ({wrong.message})" if wrong is not None else
                           "although the outputs match: every returned tensor must be computed from the "
                           "inputs with differentiable operations (no .detach(), no torch.no_grad())")
                    atol, rtol = dg.tolerance(GRAD_TOL)
                    return dg.fail(f"the gradient of {name} differs from the reference {why}",
                                   dg.number_detail(g, w, GRAD_TOL, f"grad {name}", inputs,
                                                    f"gradient tolerance: |error| <= {atol:g} + "
                                                    f"{rtol:g}·|expected|"))
        return dg.PASS

    return dg.judged(judge)


GRAD_TOL = torch.float16

@rebuildable(names_mistakes=True)
def cuda_judge(recipe: Recipe):
    """Calls come in pairs (cuda, cpu): the CUDA result is on CUDA, matches the
    reference, and matches the student's own CPU result."""

    def judge(calls, outcomes):
        for k in range(0, len(calls) - 1, 2):
            call, out_gpu, out_cpu = calls[k], outcomes[k], outcomes[k + 1]
            inputs = inputs_of(recipe, call)
            if out_gpu.error is not None:
                return dg.fail("on CUDA " + errors.explain_error(out_gpu.error), f"inputs on cuda: {inputs}")
            got, msg = dg.unpack(out_gpu.output, recipe.out_names)
            if msg:
                return dg.fail("on CUDA " + msg)
            devices = out_gpu.devices if isinstance(out_gpu.devices, tuple | list) else (out_gpu.devices,)
            for i, out in enumerate(recipe.outs):
                dev = devices[i] if i < len(devices) else None
                if dev != "cuda":
                    return dg.fail(f"{out.name} is on {dev}; expected cuda — " + MISTAKES["wrong_device"])
            verdict = judge_call(recipe, call, out_gpu)
            if verdict is not None:
                return dg.fail("on CUDA " + verdict.message, verdict.detail)
            mine, msg = dg.unpack(out_cpu.output, recipe.out_names) if out_cpu.error is None else (None, "")
            if mine is None:
                continue  # the CPU result is judged by the CPU checks
            args, kwargs = cpu_args(call)
            dtype = float_dtype(call)
            for i, out in enumerate(recipe.outs):
                g, m, msg = fit(out, got[i], mine[i].to(got[i].dtype) if out.kind != "mask" else mine[i],
                                args, kwargs)
                if msg or g is None:
                    continue
                if out.kind == "mask":
                    if not torch.equal(g, m):
                        return dg.fail(f"{out.name} on CUDA differs from your CPU result",
                                       dg.mask_detail(m, g, inputs))
                elif not dg.close(g, m, dtype):
                    return dg.fail(f"{out.name} on CUDA differs from your CPU result",
                                   dg.number_detail(g, m, dtype, out.name, inputs))
        return dg.PASS

    return dg.judged(judge)


@rebuildable(names_mistakes=True)
def pair_judge(recipe: Recipe, rows, what: str, only: tuple[int, ...] | None = None):
    """Calls come in pairs that differ only in positions that must not matter;
    ``rows(call) -> bool (..., Lq)`` marks the query rows that must come out the
    same in the outputs ``only`` (default: all). Judged against the student's own
    outputs, not the reference."""

    def judge(calls: list[Call], outcomes) -> Verdict:
        for k in range(0, len(calls) - 1, 2):
            a, b = outcomes[k], outcomes[k + 1]
            inputs = inputs_of(recipe, calls[k])
            for o in (a, b):
                if o.error is not None:
                    return raised(o.error, inputs)
            ga, msg_a = dg.unpack(a.output, recipe.out_names)
            gb, msg_b = dg.unpack(b.output, recipe.out_names)
            if msg_a or msg_b:
                return dg.fail(msg_a or msg_b)
            keep = rows(calls[k])  # (..., Lq) bool
            dtype = float_dtype(calls[k])
            args, kwargs = cpu_args(calls[k])
            want = reference(recipe, calls[k])
            for i, (out, x, y) in enumerate(zip(recipe.outs, ga, gb)):
                if only is not None and i not in only:
                    continue
                for got in (x, y):
                    _, _, msg = fit(out, got, want[i], args, kwargs)
                    if msg:
                        return dg.fail(msg, f"inputs: {inputs}")
                sel = torch.broadcast_to(keep[..., None], x.shape)
                x0, y0 = torch.where(sel, x.double(), 0.0), torch.where(sel, y.double(), 0.0)
                if not dg.close(y0, x0, dtype):
                    # A known mistake that is not about these positions (a head layout, a scale) comes first:
                    # "the mask leaks" would send the student to the wrong line.
                    named = recipe.diagnosis(calls[k], args, kwargs, x, i, dtype)
                    return dg.fail(named or what, "the same call with those positions changed gave a "
                                   "different "
                                   f"{out.name} (got: after the change, expected: before it):\n"
                                   + dg.number_detail(y0, x0, dtype, out.name, inputs))
        return dg.PASS

    return dg.judged(judge)


@rebuildable(names_mistakes=True)
def decoding_judge(recipe: Recipe):
    """KV-cache decoding (``out, k_all, v_all = f(q, k_new, v_new, k_cache, v_cache)``): the
    first call is a full pass over L tokens with an empty cache, then one call per token, then
    one chunk of tokens 2..4; the step and chunk outputs equal the rows of the full pass, and
    each returned k_all is the sequence's prefix."""

    def judge(calls: list[Call], outcomes) -> Verdict:
        for call, o in zip(calls, outcomes):
            if o.error is not None:
                return raised(o.error, inputs_of(recipe, call))
        # the steps are compared with the student's own full pass: a wrong full pass is the news
        wrong = judge_call(recipe, calls[0], outcomes[0], only=(0,))
        if wrong is not None:
            return dg.fail("the full pass (an empty cache, all L tokens at once) already differs from the "
                           "reference, before any decoding step: " + wrong.message, wrong.detail)
        outs = []
        for call, o in zip(calls, outcomes):
            got, msg = dg.unpack(o.output, recipe.out_names)
            if msg:
                return dg.fail(msg)
            args, kwargs = cpu_args(call)
            for out, g, w in zip(recipe.outs, got, reference(recipe, call)):
                _, _, msg = fit(out, g, w, args, kwargs)
                if msg:
                    return dg.fail(msg, f"inputs: {inputs_of(recipe, call)}")
            outs.append(got)
        full, k = outs[0][0], calls[0].args[1]
        L = full.shape[2]
        pieces = [(t, t + 1, outs[1 + t]) for t in range(L)] + [(2, 5, outs[-1])]
        for (start, stop, got), call in zip(pieces, calls[1:]):
            label = f"token {start}" if stop == start + 1 else f"tokens {start}..{stop - 1} at once"
            want = full[:, :, start:stop]
            if not dg.close(got[0], want, torch.float32):
                return dg.fail(
                    f"decoding {label} with a cache of {start} gave a different output than the full pass: "
                    "new query i must see exactly keys 0 .. T + i",
                    dg.number_detail(got[0], want, torch.float32, "out", inputs_of(recipe, call)))
            if not torch.equal(got[1], k[:, :, :stop]):
                return dg.fail(f"decoding {label}: k_all is not cat(k_cache, k_new, dim=2)")
        return dg.PASS

    return dg.judged(judge)


# --------------------------------------------------------------------------- check factories

def on_device(recipe: Recipe, name: str, calls: list[Call], device: str = "meta", *,
              vectorised: bool = True) -> Check:
    """Outputs on ``device``. A call that leaves optional arguments out checks the
    tensors the function makes for them; ``vectorised`` (see :func:`device_judge`)."""
    return Check(name, calls, device_judge(recipe, device, vectorised), kind="property")


def unchanged(recipe: Recipe, name: str, calls: list[Call]) -> Check:
    return Check(name, calls, unchanged_judge(recipe), kind="property")


def gradients(recipe: Recipe, name: str, calls: list[Call], *, public: bool = False,
              nan_why: str | None = None) -> Check:
    """Gradients finite and matching; ``nan_why`` explains a NaN gradient where there is no softmax."""
    judge = grads_judge(recipe, nan_why) if nan_why else grads_judge(recipe)
    return Check(name, calls, judge, want_grads=True, public=public)


def on_cuda(recipe: Recipe, name: str, calls: list[Call], *, cuda_kwargs: bool = False) -> Check:
    """Each call runs on CUDA and on the CPU. With ``cuda_kwargs`` (builders from
    integers) the device is passed as ``device=`` instead."""
    pairs: list[Call] = []
    for c in calls:
        if cuda_kwargs:
            pairs += [Call(c.args, {**c.kwargs, "device": "cuda"}, "cuda"),
                      Call(c.args, {**c.kwargs, "device": "cpu"}, "cpu")]
        else:
            pairs += [Call(c.args, dict(c.kwargs), "cuda"), Call(c.args, dict(c.kwargs), "cpu")]
    kind = "edge" if guessable(recipe, calls) else "value"
    return Check(name, pairs, cuda_judge(recipe), requires="cuda", kind=kind)


def int_mask_checks(R: Recipe, seed: int, hidden: bool, public: list[tuple[str, tuple]],
                    edges: list[tuple[str, tuple]], draw) -> list[Check]:
    """The checks of a mask builder from integers: the ``public`` cases (the second one
    degenerate, so an edge), and when ``hidden``, the ``edges``, random cases from
    ``draw(gen) -> args``, dtype (on the first public case), ``device=`` (meta) and CUDA."""
    checks = [values(R, name, [Call(args)], public=True, edge=i == 1)
              for i, (name, args) in enumerate(public)]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    random_args = [draw(gen) for _ in range(3)]
    return checks + [
        *[values(R, name, [Call(args)], edge=True) for name, args in edges],
        values(R, "matches reference (random sizes)", [Call(a) for a in random_args]),
        dtypes(R, "returns torch.bool", [Call(public[0][1])]),
        on_device(R, "honours device= (meta)", [Call(random_args[0], {"device": "meta"})]),
        on_cuda(R, "matches on CUDA", [Call(random_args[-1])], cuda_kwargs=True),
    ]
