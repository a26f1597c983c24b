"""The class "a tensor made on PyTorch's default device instead of the inputs'", caught on a
CPU-only machine: the calls run with CPU inputs inside ``with torch.device("meta"):``
(``Call.default_device``), so that a tensor the function makes without ``device=`` lands on
meta, meets the CPU inputs and raises, or comes back on meta.

:func:`made_on_default` judges that part of an outcome; each judge factory here then hands the
outcomes to the exercise's own judge (the contract's outputs, an answer, a ring's steps), so that
no output which is not the contract's passes on its device alone.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import diagnose as dg
from ... import errors
from ...spec import Call, Outcome, Verdict
from .answers import answers_judge
from .judges import Recipe, inputs_of, raised, rebuildable

#: What a tensor made on the default device means, for the check that moves the default away.
MADE_ON_DEFAULT = ("a tensor is made on PyTorch's default device instead of the inputs': with the inputs on "
                   "the CPU and the default device moved elsewhere (with torch.device(\"meta\"): ...), the "
                   "function made something there. On a GPU the same code puts it on the CPU beside CUDA "
                   "inputs. Give "
                   "every tensor you create device=<input>.device (torch.arange(n, device=x.device), "
                   "torch.zeros(..., device=x.device)), or build it from an input (zeros_like, new_zeros).")


def _devices(devices) -> list[str | None]:
    """The devices of an outcome's tensors, however deep (``ring_attention``'s steps are lists)."""
    if isinstance(devices, tuple | list):
        return [d for part in devices for d in _devices(part)]
    return [devices]


def made_on_default(out_names: tuple[str, ...], inputs: str, call: Call, outcome: Outcome) -> Verdict | None:
    """The failing verdict of one call run with the default device moved (it raised, or an output
    is off the CPU), or None when nothing in it was made on the default device."""
    where = f"inputs on cpu, default device {call.default_device}: {inputs}"
    if outcome.error is not None:
        if errors.is_stub_error(outcome.error) or not (
                errors.mixes_devices(outcome.error) or errors.reads_values(outcome.error)
                or "meta" in str(outcome.error)):
            return raised(outcome.error, inputs)  # not a device's doing
        return dg.fail(MADE_ON_DEFAULT + f" (it raised {errors.quoted(outcome.error)})", where)
    devices = outcome.devices if isinstance(outcome.devices, tuple | list) else (outcome.devices,)
    for i, dev in enumerate(devices):
        name = out_names[i] if i < len(out_names) else f"output {i}"
        elsewhere = [d for d in _devices(dev) if d not in (None, "cpu")]
        if elsewhere:
            return dg.fail(f"{name} is on {elsewhere[0]}; expected cpu, the inputs' device — "
                           + MADE_ON_DEFAULT, where)
    return None


def then(out_names: tuple[str, ...], describe: Callable[[Call], str], judge) -> Callable:
    """A judge: :func:`made_on_default` on every call, then ``judge`` on them all."""

    def first_the_device(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, outcome in zip(calls, outcomes):
            verdict = made_on_default(out_names, describe(call), call, outcome)
            if verdict is not None:
                return verdict
        return judge(calls, outcomes)

    return dg.judged(first_the_device)


@rebuildable(names_mistakes=True)
def default_device_answers_judge(recipe: Recipe, kind: str, what: str):
    """The reference's answer (:func:`~.answers.answers_judge`), computed with the default moved."""
    return then(recipe.out_names, lambda c: inputs_of(recipe, c), answers_judge(recipe, kind, what))
