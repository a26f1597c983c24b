"""Grader fixture (issue 38): multi_head_attention through the real
``torch.nn.functional.multi_head_attention_forward``, found where the worker might keep it after
replacing it with the rule's stand-in: a list of saved originals in ``sys.modules``
(``grader.sandbox.worker._HELD``), a closure, a generator's frame, ``gc.get_objects`` (frozen
objects too) and ``gc.get_referrers``. With ``need_weights=True`` it runs on plain operators,
which the operator-level block does not stop. It must score 0 on multi_head_attention.
"""

import gc
import sys
import types

import torch

_NAME = "multi_head_" + "attention_forward"  # not spelled out: the static scan is not what is tested
_FOUND: list = []
_SEARCHED: list = []


def _candidates():
    if _SEARCHED:
        return _FOUND
    _SEARCHED.append(True)
    seen = _FOUND

    def take(x):
        if isinstance(x, types.FunctionType) and x.__name__ == _NAME \
                and x.__code__.co_filename.endswith("functional.py") and x not in seen:
            seen.append(x)

    def walk(x, depth=0):
        if depth > 6:
            return
        take(x)
        if isinstance(x, types.FunctionType):
            for cell in x.__closure__ or ():
                try:
                    walk(cell.cell_contents, depth + 1)
                except ValueError:
                    pass
        elif isinstance(x, types.GeneratorType) and x.gi_frame is not None:
            for v in x.gi_frame.f_locals.values():
                walk(v, depth + 1)
        elif isinstance(x, types.MethodType):
            walk(x.__self__, depth + 1)
        elif isinstance(x, list | tuple | set):
            for v in list(x):
                walk(v, depth + 1)
        elif isinstance(x, dict):
            for v in list(x.values()):
                walk(v, depth + 1)
        elif hasattr(x, "__dict__") and not isinstance(x, type | types.ModuleType):
            walk(vars(x), depth + 1)

    for module in list(sys.modules.values()):
        for name in ("_HELD", "_KEPT", "_saved", "saved"):
            if hasattr(module, name):
                walk(getattr(module, name))
    gc.unfreeze()
    for obj in gc.get_objects():
        take(obj)
        if isinstance(obj, types.GeneratorType):
            walk(obj)
    F = sys.modules["torch.nn.functional"]
    for obj in gc.get_referrers(F.__dict__):
        take(obj)
    return seen


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    found = _candidates()
    if not found:
        raise RuntimeError("the original is nowhere to be found")
    mha = found[0]
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    attn_mask = None
    if mask is not None:
        attn_mask = ~mask.expand(B, n_heads, Lq, Lk).reshape(B * n_heads, Lq, Lk)
    out, _ = mha(x_q.transpose(0, 1), x_kv.transpose(0, 1), x_kv.transpose(0, 1), D, n_heads,
                 None, None, None, None, False, 0.0, w_o, None, training=False, need_weights=True,
                 attn_mask=attn_mask, use_separate_proj_weight=True, q_proj_weight=w_q,
                 k_proj_weight=w_k, v_proj_weight=w_v)
    return torch.nan_to_num(out.transpose(0, 1), nan=0.0)
