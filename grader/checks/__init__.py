"""What the autograder checks: the seventeen exercises of the contract, in chapter order.

``EXERCISES[name].make_checks(seed, hidden=False)`` gives the public checks (the
ones the in-notebook ``check`` runs); ``hidden=True`` adds the randomized
hidden checks drawn from ``seed``. Points are declared once, in :data:`POINTS`.
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

#: Points per exercise (the only place they are declared). They add up to 100:
#: the four chapter-9 exercises took 20 points from the seven 10-point ones.
POINTS: dict[str, float] = {
    "causal_mask": 5.0,
    "influence_matrix": 7.0,
    "to_additive": 5.0,
    "masked_softmax": 7.0,
    "attention": 8.0,
    "padding_mask": 5.0,
    "decoder_mask": 7.0,
    "encoder_decoder_masks": 6.0,
    "multi_head_attention": 8.0,
    "kv_cache_attention": 7.0,
    "sliding_window_mask": 5.0,
    "prefix_lm_mask": 5.0,
    "document_mask": 5.0,
    "left_padding_position_ids": 5.0,
    "packed_labels": 5.0,
    "gqa_attention": 5.0,
    "alibi_bias": 5.0,
}

_MAKERS = [
    (1, ch1_leakage.causal_mask_checks),
    (1, ch1_leakage.influence_matrix_checks),
    (2, ch2_softmax.to_additive_checks),
    (2, ch2_softmax.masked_softmax_checks),
    (2, ch2_softmax.attention_checks),
    (3, ch3_padding.padding_mask_checks),
    (4, ch4_combined.decoder_mask_checks),
    (5, ch5_cross.encoder_decoder_masks_checks),
    (5, ch5_cross.multi_head_attention_checks),
    (6, ch6_cache.kv_cache_attention_checks),
    (7, ch7_variants.sliding_window_mask_checks),
    (7, ch7_variants.prefix_lm_mask_checks),
    (7, ch7_variants.document_mask_checks),
    (9, ch9_real.left_padding_position_ids_checks),
    (9, ch9_real.packed_labels_checks),
    (9, ch9_real.gqa_attention_checks),
    (9, ch9_real.alibi_bias_checks),
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
for _chapter, _make in _MAKERS:
    _name = _make.__name__.removesuffix("_checks")
    EXERCISES[_name] = Exercise(_name, _chapter, with_public_rules(_make), POINTS[_name])

_SUMMARIES = {
    "causal_mask": "causal_mask(n, *, device=None): bool (n, n), True where key j <= query i.",
    "influence_matrix": "influence_matrix(f, x): for x (L, d), the (L, L) matrix of Frobenius norms "
                        "||∂f(x)[i] / ∂x[j]||; x unchanged.",
    "to_additive": "to_additive(mask, dtype=torch.float32): 0 where the mask is True, -inf (or <= "
                   "finfo(dtype).min) where False; same shape, requested dtype, on the mask's device.",
    "masked_softmax": "masked_softmax(scores, mask): softmax over the last dim with the bool mask applied "
                      "before normalising; fully masked rows give zeros, never NaN.",
    "attention": "attention(q, k, v, mask=None): scaled dot-product attention with scale 1/sqrt(d); "
                 "returns (out (..., Lq, dv), weights (..., Lq, Lk)), zeros for fully masked rows.",
    "padding_mask": "padding_mask(lengths, max_len): bool (B, max_len), True at positions < lengths[b]; "
                    "vectorised, on lengths' device.",
    "decoder_mask": "decoder_mask(lengths, max_len): broadcasts to (B, 1, L, L): causal AND key position "
                    "< lengths[b]; padded query rows are not masked.",
    "encoder_decoder_masks": "encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len): "
                             "(enc_self, dec_self, cross) masks for (B,1,S,S), (B,1,T,T), (B,1,T,S).",
    "multi_head_attention": "multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None): "
                            "(B, Lq, D) with heads of width d = D // n_heads, weights applied as x @ w.T.",
    "kv_cache_attention": "kv_cache_attention(q, k_new, v_new, k_cache, v_cache): n new tokens attend the "
                          "cache and themselves (query i sees keys 0 .. T + i); returns (out, k_all, v_all).",
    "sliding_window_mask": "sliding_window_mask(n, window, *, device=None): bool (n, n), j <= i and "
                           "i - j < window.",
    "prefix_lm_mask": "prefix_lm_mask(n, prefix_len, *, device=None): bool (n, n), j <= i or j < prefix_len.",
    "document_mask": "document_mask(doc_ids): broadcasts to (B, 1, L, L): same document id and j <= i.",
    "left_padding_position_ids": "left_padding_position_ids(keep): int64 (B, L), each row's real tokens "
                                 "(keep True) numbered 0, 1, 2, ... in order; 0 at padding.",
    "packed_labels": "packed_labels(tokens, doc_ids, ignore_index=-100): int64 (B, L), tokens[b, t + 1] "
                     "where t + 1 is in t's document, else ignore_index; the last column is ignore_index.",
    "gqa_attention": "gqa_attention(q, k, v, mask=None): (B, Hq, Lq, dv); query head h attends with "
                     "key/value head h // G (Hq = G * Hkv), scale 1/sqrt(d), zeros for fully masked rows.",
    "alibi_bias": "alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32): (H, Lq, Lk) causal "
                  "ALiBi bias, bottom-right aligned: -slope_h * (pos_q - j), -inf for j > pos_q.",
}


def public_summary(name: str) -> str:
    """The one-line task statement of exercise ``name``."""
    if name not in _SUMMARIES:
        raise KeyError(f"unknown exercise {name!r}; expected one of {list(EXERCISES)}")
    return _SUMMARIES[name]


__all__ = ["EXERCISES", "POINTS", "public_summary"]
