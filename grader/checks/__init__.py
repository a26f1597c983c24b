"""What the autograder checks: the seventeen exercises of the contract, in chapter order.

``EXERCISES[name].make_checks(seed, hidden=False)`` gives the public checks (the
ones the in-notebook ``check`` runs); ``hidden=True`` adds the randomized
hidden checks drawn from ``seed``. Each exercise is declared once, in ``_DECLARED``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .. import cases
from ..spec import Check, Exercise
from . import (
    ch1_leakage,
    ch2_softmax,
    ch3_padding,
    ch4_combined,
    ch5_cross,
    ch6_cache,
    ch7_variants,
    ch9_real,
)

#: The graded exercises, in chapter order, one row each: (chapter, points, the function
#: that makes its checks, named after the exercise, and its one-line task statement). This
#: is the one place the grader declares them; the order and the names are the contract's
#: (``attnmask.CONTRACT``, test_checks_registry). The points add up to 100.
_DECLARED: list[tuple[int, float, Callable[..., list[Check]], str]] = [
    (1, 5.0, ch1_leakage.causal_mask_checks,
     "causal_mask(n, *, device=None): bool (n, n), True where key j <= query i."),
    (1, 7.0, ch1_leakage.influence_matrix_checks,
     "influence_matrix(f, x): for x (L, d), the (L, L) matrix of Frobenius norms "
     "||∂f(x)[i] / ∂x[j]||; x unchanged."),
    (2, 5.0, ch2_softmax.to_additive_checks,
     "to_additive(mask, dtype=torch.float32): 0 where the mask is True, -inf (or <= "
     "finfo(dtype).min) where False; same shape, requested dtype, on the mask's device."),
    (2, 7.0, ch2_softmax.masked_softmax_checks,
     "masked_softmax(scores, mask): softmax over the last dim with the bool mask applied "
     "before normalising; fully masked rows give zeros, never NaN."),
    (2, 8.0, ch2_softmax.attention_checks,
     "attention(q, k, v, mask=None): scaled dot-product attention with scale 1/sqrt(d); "
     "returns (out (..., Lq, dv), weights (..., Lq, Lk)), zeros for fully masked rows."),
    (3, 5.0, ch3_padding.padding_mask_checks,
     "padding_mask(lengths, max_len): bool (B, max_len), True at positions < lengths[b]; "
     "vectorised, on lengths' device."),
    (4, 7.0, ch4_combined.decoder_mask_checks,
     "decoder_mask(lengths, max_len): broadcasts to (B, 1, L, L): causal AND key position "
     "< lengths[b]; padded query rows are not masked."),
    (5, 6.0, ch5_cross.encoder_decoder_masks_checks,
     "encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len): (enc_self, "
     "dec_self, cross) masks for (B,1,S,S), (B,1,T,T), (B,1,T,S)."),
    (5, 8.0, ch5_cross.multi_head_attention_checks,
     "multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None): (B, Lq, D) "
     "with heads of width d = D // n_heads, weights applied as x @ w.T."),
    (6, 7.0, ch6_cache.kv_cache_attention_checks,
     "kv_cache_attention(q, k_new, v_new, k_cache, v_cache): n new tokens attend the cache "
     "and themselves (query i sees keys 0 .. T + i); returns (out, k_all, v_all)."),
    (7, 5.0, ch7_variants.sliding_window_mask_checks,
     "sliding_window_mask(n, window, *, device=None): bool (n, n), j <= i and i - j < "
     "window."),
    (7, 5.0, ch7_variants.prefix_lm_mask_checks,
     "prefix_lm_mask(n, prefix_len, *, device=None): bool (n, n), j <= i or j < "
     "prefix_len."),
    (7, 5.0, ch7_variants.document_mask_checks,
     "document_mask(doc_ids): broadcasts to (B, 1, L, L): same document id and j <= i."),
    (9, 5.0, ch9_real.left_padding_position_ids_checks,
     "left_padding_position_ids(keep): int64 (B, L), each row's real tokens (keep True) "
     "numbered 0, 1, 2, ... in order; 0 at padding."),
    (9, 5.0, ch9_real.packed_labels_checks,
     "packed_labels(tokens, doc_ids, ignore_index=-100): int64 (B, L), tokens[b, t + 1] "
     "where t + 1 is in t's document, else ignore_index; the last column is ignore_index."),
    (9, 5.0, ch9_real.gqa_attention_checks,
     "gqa_attention(q, k, v, mask=None): (B, Hq, Lq, dv); query head h attends with "
     "key/value head h // G (Hq = G * Hkv), scale 1/sqrt(d), zeros for fully masked rows."),
    (9, 5.0, ch9_real.alibi_bias_checks,
     "alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32): (H, Lq, Lk) causal "
     "ALiBi bias, bottom-right aligned: -slope_h * (pos_q - j), -inf for j > pos_q."),
]

def with_public_rules(make: Callable[..., list[Check]]) -> Callable[..., list[Check]]:
    """``make`` with every property check (dtype, device, inputs unchanged, invariances)
    drawn from the public seed and run among the public checks: a rule the contract
    states is met in the notebook's ``check``, not first in hidden grading. Hidden
    checks then only draw new cases for the values; they add no rule."""

    def make_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
        checks = make(seed, hidden)
        rules = [replace(c, public=True) for c in make(cases.PUBLIC_SEED, True)
                 if c.kind == "property" and c.requires is None]
        public = [c for c in checks if c.public]
        rest = [c for c in checks if not c.public and c.kind != "property"]
        return public + rules + rest

    make_checks.__name__ = make.__name__
    make_checks.__doc__ = make.__doc__
    return make_checks


#: The graded exercises, in chapter order, by function name.
EXERCISES: dict[str, Exercise] = {}
#: Points per exercise.
POINTS: dict[str, float] = {}
_SUMMARIES: dict[str, str] = {}
for _chapter, _points, _make, _summary in _DECLARED:
    _name = _make.__name__.removesuffix("_checks")
    EXERCISES[_name] = Exercise(_name, _chapter, with_public_rules(_make), _points)
    POINTS[_name], _SUMMARIES[_name] = _points, _summary


def public_summary(name: str) -> str:
    """The one-line task statement of exercise ``name``."""
    if name not in _SUMMARIES:
        raise KeyError(f"unknown exercise {name!r}; expected one of {list(EXERCISES)}")
    return _SUMMARIES[name]


__all__ = ["EXERCISES", "POINTS", "public_summary"]
