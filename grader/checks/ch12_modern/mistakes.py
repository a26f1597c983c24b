"""Chapter 12's classic mistakes, in plain words (one definition each): what its checks
(:mod:`.architectures`) name in feedback."""

from __future__ import annotations

#: The chapter's classic mistakes, in plain words (one definition each).
MISTAKES12: dict[str, str] = {
    "sink_ignored": "the sink takes no weight: this is plain attention. Leaving the sink out, or "
                    "adding it to every score (a shift the softmax cancels), changes nothing; it is "
                    "one more logit in the denominator only, exp(sink_h - m).",
    "sink_value": "the sink's weight lands on a value: after a softmax over the scores and the sink "
                  "together, drop the sink's own column; the sink takes weight but contributes no "
                  "value.",
    "sink_not_exp": "the sink is added to the denominator as it is: it is a logit, so the denominator"
                    " gains exp(sink_h - m), like any score.",
    "sink_max": "a fully masked row gives NaN: its maximum over the allowed scores is −∞, and "
                "exp(sink − (−∞)) is infinite. Take m over the allowed scores and the sink: m is then "
                "finite, the sink takes all the weight and the row's output is zero.",
    "sink_half": "the softmax ran in half precision: it rounds a score near a thousand by up to a quarter, "
                 "which moves that key's weight by about a quarter. Compute scores and softmax in single "
                 "precision, cast the result back.",
    "sel_top_left": "query i is placed at position i: the queries are the last Lq of the Lk "
                    "positions, query i at Lk - Lq + i (bottom-right), so a decoding query sees every"
                    " key.",
    "sel_ties": "ties go to the higher key index: among equal scores keep the lowest indices (a "
                "stable sort keeps the original order; torch.topk promises no order among ties).",
    "sel_nan": "a NaN score was selected: torch.topk and torch.sort treat NaN as larger than any "
               "number. Treat a NaN key as one the query may not see before ranking.",
    "sel_future": "a query that sees fewer than k keys took blocked keys to make up k: keep only the "
                  "keys it may see (AND the top k with the visible keys).",
    "sel_not_causal": "the causal rule is missing: with causal=True query i (at Lk - Lq + i) may "
                      "select only keys j <= Lk - Lq + i, however high a later key scores.",
    "bd_own_clean": "a noisy token sees the clean tokens of its own block: that is the answer it must"
                    " denoise. Noisy tokens see clean tokens of strictly earlier blocks only.",
    "bd_clean_own_block": "clean tokens see only their own block: the clean copy is block-causal, "
                          "each clean token sees the clean tokens of its own and every earlier block.",
    "bd_noisy_causal": "the noisy tokens of a block see each other causally: inside a block the noisy"
                       " tokens are denoised together, bidirectionally.",
    "bd_clean_sees_noisy": "clean tokens see noisy tokens: the clean half [L, 2L) must see clean "
                           "tokens only.",
    "bd_no_context": "noisy tokens do not see the clean tokens of earlier blocks: those are the "
                     "context each block is denoised from.",
    "decay_cumsum": "NaN where D has a value: D came from exp of a cumulative sum (exp(c_i) / "
                    "exp(c_j), or exp(c_i − c_j)). On a long sequence exp(c) underflows to zero and "
                    "gives zero over zero; a closed gate (log a = −∞) gives −∞ − (−∞). Sum the gates of "
                    "each range, the positions after j up to i, directly (a cumulative sum down each "
                    "column of a masked (L, L) copy of the gates), then exp.",
    "decay_grad_overflow": "no softmax here: the NaN comes from exp. If D is exp of a difference of "
                           "cumulative sums, exp(c_i − c_j), the cells then set to zero (above the "
                           "diagonal, across documents) hold a positive c_i − c_j, large on a long sequence: "
                           "exp overflows to infinity there. Setting them to zero afterwards hides it in D, "
                           "not in the backward pass, where zero times infinity is NaN. Sum each range (the "
                           "positions after j up to i) directly, and put −∞ in the cells that must be zero "
                           "before the exp, never after.",
    "decay_range": "the sum runs over the wrong range: D[i, j] multiplies the gates of the positions after "
                   "j up to i, so the diagonal is one and the entry just left of it is a_i.",
    "decay_no_docs": "the documents are not reset: D must be zero between positions of different "
                     "documents (the state starts again at each border).",
    "decay_transposed": "D is transposed: D[b, i, j] is the decay from key j to query i >= j (lower "
                        "triangle).",
}
