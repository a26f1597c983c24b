"""The public checks as data: recorded from the reference at release, replayed in the student template.

``python -m grader release`` runs :func:`record`: for every exercise it builds the
public checks (the ones the notebook's ``check`` runs), and for every call of
them stores what the checks' judges ask of the reference -- its outputs (in the
contract's shape), each output's expected dtype, and the outputs of the classic
mistakes its recogniser compares a wrong answer with -- together with the calls
themselves and how each judge was made (:func:`grader.checks.common.judges.rebuildable`).
:func:`write` saves that with ``torch.save``; :func:`load` reads it back with
``torch.load(weights_only=True)``, which builds tensors and plain containers and
runs no code, and rebuilds the same judges around recipes that answer from the
data (:class:`RecordedRecipe`). So the student template holds expected outputs,
not the reference (``attnmask``) nor the recognisers' code, and its ``check``
still names the classic mistakes.

Only the public checks are recorded: hidden cases are drawn from the term's seed,
and only the instructor's grader, which has the reference, runs them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import diagnose as dg
from ..spec import Call, Check, Exercise, FnSpec
from .agreement import same
from .common import answers as _answers  # noqa: F401 -- registers its judge factory
from .common import judges as J
from .common import merging as _merging  # noqa: F401 -- registers its judge factories
from .common import properties as _properties  # registers its judge factories; NaN reasons
from .common import tile_judge as _tile_judge  # noqa: F401 -- registers its judge factories

#: Where release writes the data, inside the grader package (so the wheel and the template carry it).
DATA = Path(__file__).resolve().parent.parent / "data" / "public_checks"
FORMAT = 1


class NotRecorded(LookupError):
    """A public check asked the reference for something release did not record."""


# --------------------------------------------------------------------------- plain data

def pack(x: Any) -> Any:
    """``x`` as what ``torch.load(weights_only=True)`` reads back: tensors, numbers, strings,
    dtypes and containers of them (a :class:`FnSpec` becomes a tagged dict)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().contiguous()
    if isinstance(x, FnSpec):
        return {"__fnspec__": x.kind, "params": pack(x.params)}
    if isinstance(x, tuple):
        return tuple(pack(v) for v in x)
    if isinstance(x, list):
        return [pack(v) for v in x]
    if isinstance(x, dict):
        return {str(k): pack(v) for k, v in x.items()}
    if x is None or isinstance(x, bool | int | float | str | torch.dtype):
        return x
    raise TypeError(f"{type(x).__name__} cannot be recorded as plain data")


def unpack(x: Any) -> Any:
    if isinstance(x, dict):
        if "__fnspec__" in x:
            return FnSpec(x["__fnspec__"], unpack(x["params"]))
        return {k: unpack(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(unpack(v) for v in x)
    if isinstance(x, list):
        return [unpack(v) for v in x]
    return x


def _digest(h, x: Any) -> None:
    if isinstance(x, torch.Tensor):
        h.update(f"T{x.dtype}{tuple(x.shape)}{x.device.type}".encode())
        if x.device.type != "meta":
            t = x.detach().cpu().contiguous()
            h.update((t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)).numpy().tobytes()
                     if t.numel() else b"")
    elif isinstance(x, FnSpec):
        h.update(f"F{x.kind}".encode())
        _digest(h, x.params)
    elif isinstance(x, tuple | list):
        h.update(f"{type(x).__name__}{len(x)}(".encode())
        for v in x:
            _digest(h, v)
        h.update(b")")
    elif isinstance(x, dict):
        h.update(f"D{len(x)}(".encode())
        for k in sorted(x):
            h.update(f"{k}=".encode())
            _digest(h, x[k])
        h.update(b")")
    else:
        h.update(f"{type(x).__name__}:{x!r};".encode())


def call_key(call: Call) -> str:
    """A digest of everything in ``call`` (its tensors' values included)."""
    h = hashlib.sha256()
    for f in dataclasses.fields(call):
        h.update(f"{f.name}:".encode())
        _digest(h, getattr(call, f.name))
    return h.hexdigest()


def _call_data(call: Call) -> dict[str, Any]:
    return {f.name: pack(getattr(call, f.name)) for f in dataclasses.fields(call)}


def _call_from(data: Mapping[str, Any]) -> Call:
    names = {f.name for f in dataclasses.fields(Call)}
    return Call(**{k: unpack(v) for k, v in data.items() if k in names})


# --------------------------------------------------------------------------- recording (release)

def _mistakes(recipe: J.Recipe, call: Call, want: list[torch.Tensor]) -> list[list[tuple[str, torch.Tensor]]]:
    """Per output: the classic mistakes the recipe's recogniser compares with, and their outputs.

    The recogniser runs with the reference's own output as the answer, and every candidate it
    passes to :func:`grader.diagnose.name_mistake` is computed and kept (candidates that equal
    the reference, or that raise, are left out: they could never be named)."""
    if recipe.diagnose is None:
        return [[] for _ in want]
    args, kwargs = J.cpu_args(call)
    dtype = J.float_dtype(call)
    out = []
    for index, w in enumerate(want):
        seen: list[tuple[str, torch.Tensor]] = []

        def collect(got, candidates, dtype_, index_=None, seen=seen, w=w):
            for message, thunk in candidates:
                try:
                    cand = thunk()
                    if index_ is not None and isinstance(cand, tuple | list):
                        cand = cand[index_]
                    if not (isinstance(cand, torch.Tensor) and dg.plain(cand)) or dg._same(w, cand, dtype_):
                        continue
                    if not any(m == message and c.shape == cand.shape and torch.equal(c, cand)
                               for m, c in seen):
                        seen.append((message, cand.detach().clone().contiguous()))
                except Exception:  # noqa: BLE001,S112 -- as name_mistake: it just cannot match
                    continue
            return None

        real = dg.name_mistake
        dg.name_mistake = collect
        try:
            recipe.diagnose(args, kwargs, w, index, dtype)
        except Exception:  # noqa: BLE001 -- a recogniser that fails on the reference names nothing
            pass
        finally:
            dg.name_mistake = real
        out.append(seen)
    return out


def _answer(recipe: J.Recipe, call: Call, mistakes: bool, grads: bool = False) -> dict[str, Any]:
    args, kwargs = J.cpu_args(call)
    want = recipe.expected(call)
    shaped = []
    for out, w in zip(recipe.outs, want):
        if out.shape is not None and out.kind == "mask":
            w = torch.broadcast_to(w, out.shape(args, kwargs))
        shaped.append(w.detach().clone().contiguous())
    narrow = J.cpu_args(call, wide=False)
    return {"want": shaped, "dtypes": [out.expected_dtype(call, *narrow) for out in recipe.outs],
            "mistakes": _mistakes(recipe, call, shaped) if mistakes else [[] for _ in shaped],
            # by argument position, as a list: plain data keeps only string keys
            "grads": [[i, g] for i, g in recipe.expected_grads(call).items()] if grads else None}


def _recipe_data(recipe: J.Recipe) -> dict[str, Any]:
    return {"name": recipe.name, "arg_names": list(recipe.arg_names),
            "kept": None if recipe.kept is None else list(recipe.kept),
            "outs": [{"name": o.name, "kind": o.kind, "letters": o.letters} for o in recipe.outs],
            "answers": {}}


def _judge_data(check: Check, exercise: str, recipes: dict[str, dict]) -> dict[str, Any]:
    made_by = getattr(check.judge, "made_by", None)
    if made_by is None:
        raise TypeError(
            f"{exercise}: the public check {check.name!r} has a judge the student template cannot rebuild; "
            "make it with a factory declared @rebuildable in grader/checks/judges.py or properties.py "
            "(the chapter modules are not in the template)")
    factory, args, kwargs = made_by
    mistakes = factory in J.NAMES_MISTAKES

    def arg(x):
        if isinstance(x, J.Recipe):
            data = recipes.setdefault(x.name, _recipe_data(x))
            for call in check.calls:
                key = call_key(call)
                known = data["answers"].get(key)
                had_mistakes = bool(known and any(known["mistakes"]))
                had_grads = bool(known and known["grads"] is not None)
                if known is None or (mistakes and not had_mistakes) or (check.want_grads and not had_grads):
                    data["answers"][key] = _answer(x, call, mistakes or had_mistakes,
                                                   check.want_grads or had_grads)
            return {"__recipe__": x.name}
        if callable(x):  # a function of one call, e.g. the rows a pair check compares
            return {"__per_call__": {call_key(c): pack(x(c)) for c in check.calls}}
        return pack(x)

    return {"factory": factory, "args": [arg(a) for a in args],
            "kwargs": {k: arg(v) for k, v in kwargs.items()}}


def record(exercises: Mapping[str, Exercise], seed: int = 0) -> dict[str, Any]:
    """The public checks of ``exercises`` (computed with the reference), as plain data."""
    out = []
    for name, ex in exercises.items():
        recipes: dict[str, dict] = {}
        checks = []
        for check in ex.make_checks(seed, hidden=False):
            checks.append({"name": check.name, "kind": check.kind, "weight": float(check.weight),
                           "want_grads": bool(check.want_grads), "requires": check.requires,
                           "calls": [_call_data(c) for c in check.calls],
                           "judge": _judge_data(check, name, recipes)})
        out.append({"name": name, "chapter": int(ex.chapter), "points": float(ex.points),
                    "statement": ex.statement, "checks": checks, "recipes": recipes})
    return {"format": FORMAT, "exercises": out}


def _flatten(x: Any, parts: list[torch.Tensor], at: list[int]) -> Any:
    """``x`` with every tensor replaced by where its bytes sit in one buffer (``parts``): a file
    of one storage loads in a millisecond, one of a few hundred small tensors in a tenth of a second."""
    if isinstance(x, torch.Tensor):
        # reshape first: a 0-d tensor (an answer) cannot be viewed as bytes of another size
        raw = x.contiguous().reshape(-1).view(torch.uint8) if x.numel() else torch.zeros(0, dtype=torch.uint8)
        start = at[0]
        pad = -raw.numel() % 8  # every tensor starts 8-aligned, so that it can be viewed as its dtype
        parts += [raw, torch.zeros(pad, dtype=torch.uint8)]
        at[0] += raw.numel() + pad
        return {"__tensor__": start, "dtype": x.dtype, "shape": list(x.shape)}
    if isinstance(x, dict):
        return {k: _flatten(v, parts, at) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return type(x)(_flatten(v, parts, at) for v in x)
    return x


def _unflatten(x: Any, blob: torch.Tensor) -> Any:
    if isinstance(x, dict):
        if "__tensor__" in x:
            dtype, shape = x["dtype"], x["shape"]
            n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            return blob[x["__tensor__"]:x["__tensor__"] + n].view(dtype).view(shape)
        return {k: _unflatten(v, blob) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return type(x)(_unflatten(v, blob) for v in x)
    return x


def _index(data: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": data["format"], "exercises": [
        {k: ex[k] for k in ("name", "chapter", "points", "statement")} for ex in data["exercises"]]}


def write(data: dict[str, Any], folder: Path = DATA) -> None:
    """``folder``/index.json (the exercises, for the registry) and one NAME.pt per exercise."""
    folder.mkdir(parents=True, exist_ok=True)
    for ex in data["exercises"]:
        parts: list[torch.Tensor] = []
        tree = _flatten({k: ex[k] for k in ("checks", "recipes")}, parts, [0])
        blob = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        torch.save({"format": data["format"], "tree": tree, "blob": blob}, folder / f"{ex['name']}.pt")
    names = {f"{ex['name']}.pt" for ex in data["exercises"]}
    for old in folder.glob("*.pt"):
        if old.name not in names:
            old.unlink()
    (folder / "index.json").write_text(json.dumps(_index(data), indent=1, ensure_ascii=False) + "\n")


def read_index(folder: Path = DATA) -> dict[str, Any]:
    return json.loads((folder / "index.json").read_text())


def read_exercise(name: str, folder: Path = DATA) -> dict[str, Any]:
    """The recorded checks and recipes of exercise ``name`` (``torch.load(weights_only=True)``)."""
    stored = torch.load(folder / f"{name}.pt", weights_only=True)
    if stored.get("format") != FORMAT:
        raise ValueError(f"{name}.pt has format {stored.get('format')!r}; this grader reads format {FORMAT}: "
                         "run `python -m grader release` again")
    return _unflatten(stored["tree"], stored["blob"])


def stale(data: dict[str, Any], folder: Path = DATA) -> bool:
    """Whether the data in ``folder`` differs from ``data`` (missing or unreadable counts as stale).

    Recordings made on different CPUs are not stale for that: answers are matched by the call
    they answer, not by its hash (:func:`canonical`), and floats are compared as :func:`same` does."""
    try:
        if read_index(folder) != json.loads(json.dumps(_index(data))):
            return True
        for ex in data["exercises"]:
            if not same(canonical(read_exercise(ex["name"], folder)),
                        canonical({k: ex[k] for k in ("checks", "recipes")})):
                return True
        names = sorted(f"{e['name']}.pt" for e in data["exercises"])
        return sorted(p.name for p in folder.glob("*.pt")) != names
    except Exception:  # noqa: BLE001 -- missing, unreadable, another format: stale all the same
        return True


def canonical(tree: Mapping[str, Any]) -> dict[str, Any]:
    """One exercise's recording with every call key (a hash of the call's bytes) replaced by the
    call's place, ``"check I call J"`` (its first place, when checks share a call).

    Some inputs are computed with floats (a forward's output and lse fed to a backward check), so
    their last bits, and with them the keys, depend on the CPU that recorded them; their places
    do not. Keys no call has are kept: they cannot match, and the recordings differ."""
    places: dict[str, str] = {}
    for i, check in enumerate(tree["checks"]):
        for j, call in enumerate(check["calls"]):
            places.setdefault(call_key(_call_from(call)), f"check {i} call {j}")

    def placed(x: Any) -> Any:
        if isinstance(x, dict):
            if "__per_call__" in x:
                return {"__per_call__": {places.get(k, k): v for k, v in x["__per_call__"].items()}}
            return {k: placed(v) for k, v in x.items()}
        if isinstance(x, tuple | list):
            return type(x)(placed(v) for v in x)
        return x

    checks = [{**c, "judge": placed(c["judge"])} for c in tree["checks"]]
    recipes = {name: {**r, "answers": {places.get(k, k): v for k, v in r["answers"].items()}}
               for name, r in tree["recipes"].items()}
    return {"checks": checks, "recipes": recipes}


# --------------------------------------------------------------------------- replaying (the template)

@dataclasses.dataclass(frozen=True)
class RecordedOut(J.Out):
    """An output whose expected dtype for each recorded call comes from the data."""

    table: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    index: int = 0

    def expected_dtype(self, call: Call, args: tuple, kwargs: dict) -> torch.dtype | None:
        return _lookup(self.table, call, self.name)["dtypes"][self.index]


@dataclasses.dataclass(frozen=True)
class RecordedRecipe(J.Recipe):
    """A recipe that answers from the recorded data instead of computing with the reference."""

    table: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def expected(self, call: Call) -> list[torch.Tensor]:
        return [t.clone() for t in _lookup(self.table, call, self.name)["want"]]

    def expected_grads(self, call: Call) -> dict[int, torch.Tensor | None]:
        grads = _lookup(self.table, call, self.name)["grads"]
        if grads is None:
            raise NotRecorded(f"{self.name}: the gradients of this case were not recorded at release; "
                              "run `python -m grader release` and rebuild the template")
        return {int(i): None if g is None else g.clone() for i, g in grads}

    def diagnosis(self, call, args, kwargs, got, index, dtype) -> str | None:
        reason = _properties.NAN_REASONS.get(self.name)
        if reason is not None:
            try:
                said = reason(args, kwargs, got)
            except Exception:  # noqa: BLE001 -- a recogniser must never make the judge fail
                said = None
            if said:
                return said
        recorded = _lookup(self.table, call, self.name)["mistakes"][index]
        return dg.name_mistake(got, [(m, lambda t=t: t) for m, t in recorded], dtype)


def _lookup(table: Mapping[str, Any], call: Call, name: str) -> dict[str, Any]:
    try:
        return table[call_key(call)]
    except KeyError:
        raise NotRecorded(f"{name}: this case was not recorded at release; run `python -m grader release` "
                          "and rebuild the template") from None


def _recipe(data: Mapping[str, Any]) -> RecordedRecipe:
    table = data["answers"]
    outs = tuple(RecordedOut(o["name"], o["kind"], o["letters"], table=table, index=i)
                 for i, o in enumerate(data["outs"]))
    kept = None if data["kept"] is None else tuple(data["kept"])
    return RecordedRecipe(data["name"], None, tuple(data["arg_names"]), outs, None, kept, table=table)


def _per_call(values: Mapping[str, Any]) -> Callable[[Call], Any]:
    def of(call: Call) -> Any:
        return values[call_key(call)]

    return of


def _judge(data: Mapping[str, Any], recipes: Mapping[str, RecordedRecipe]) -> Callable:
    def arg(x):
        if isinstance(x, dict) and "__recipe__" in x:
            return recipes[x["__recipe__"]]
        if isinstance(x, dict) and "__per_call__" in x:
            return _per_call(x["__per_call__"])
        return unpack(x)

    factory = J.FACTORIES[data["factory"]]
    return factory(*[arg(a) for a in data["args"]], **{k: arg(v) for k, v in data["kwargs"].items()})


def _checks(ex: Mapping[str, Any]) -> list[Check]:
    recipes = {name: _recipe(r) for name, r in ex["recipes"].items()}
    return [Check(c["name"], [_call_from(d) for d in c["calls"]], _judge(c["judge"], recipes),
                  public=True, weight=c["weight"], want_grads=c["want_grads"], requires=c["requires"],
                  kind=c["kind"]) for c in ex["checks"]]


def load(folder: Path = DATA) -> dict[str, Exercise]:
    """The registry the template grades with: each exercise's public checks, rebuilt from the
    data in ``folder`` when they are first asked for (``check(f)`` reads f's file only)."""
    try:
        index = read_index(folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder / 'index.json'} is missing: the student template carries the "
                                "public checks there (`python -m grader release` writes it, "
                                "`python -m grader template` copies it)") from None
    if index.get("format") != FORMAT:
        raise ValueError(f"the recorded public checks have format {index.get('format')!r}; this grader reads "
                         f"format {FORMAT}: run `python -m grader release` again")
    out: dict[str, Exercise] = {}
    for ex in index["exercises"]:
        cache: list[list[Check]] = []

        def make_checks(seed: int = 0, hidden: bool = True, name=ex["name"], cache=cache) -> list[Check]:
            if not cache:  # public only, whatever ``hidden`` says: the hidden cases need the reference
                cache.append(_checks(read_exercise(name, folder)))
            return list(cache[0])

        out[ex["name"]] = Exercise(ex["name"], ex["chapter"], make_checks, ex["points"], ex["statement"])
    return out
