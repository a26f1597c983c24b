"""Chapter 11's classic mistakes, in plain words (one definition each): what its checks
(:mod:`grader.checks.ch11_parallel`, :mod:`grader.checks.ch11_parallel.ring`,
:mod:`grader.checks.ch11_parallel.chunked`, :mod:`grader.checks.ch11_parallel.cascade`) name in feedback."""

from __future__ import annotations

from ..common import merging as MG

#: The chapter's classic mistakes, in plain words (one definition each).
MISTAKES11: dict[str, str] = {
    "lse_unscaled": "lse is the log-sum-exp of the unscaled scores q·k: take it over the scores the "
                    "softmax uses, q·k / sqrt(d).",
    "lse_unmasked": "lse sums over every key, the blocked ones too: take it over the allowed keys only "
                    "(blocked scores filled with minus infinity first), or merged parts weigh keys they "
                    "never attended.",
    "lse_empty": "a fully masked row's lse must be minus infinity (the log of an empty sum), not a finite "
                 "number or NaN: a merge then gives that part the weight zero.",
    "merge_nan_empty": MG.MERGE_NAN_EMPTY,
    "merge_overflow": MG.MERGE_OVERFLOW,
    "merge_average": "the two outputs are averaged with equal weights: weigh each by its share of the "
                     "total, exp(lse1 - lse) and exp(lse2 - lse).",
    "merge_lse_max": "the merged lse is the larger of the two: it is log(exp(lse1) + exp(lse2)), larger "
                     "than both.",
    "merge_swapped": "the weights are swapped: out1 is weighed by exp(lse1 - lse), out2 by exp(lse2 - lse).",
    "merge_unnormalised": "the weights do not add up to one: divide by the total, i.e. use exp(lse_i - lse) "
                          "with lse the merged log-sum-exp, not exp(lse_i - max).",
    "ring_contiguous": "contiguous sharding: rank r holds two neighbouring chunks here. Zigzag sharding "
                       "gives rank r chunk r from the start and chunk r from the end, one early and one "
                       "late, so that causal work is balanced.",
    "ring_source_plus": "the keys at step s are taken from rank (r + s) mod world: the ring passes keys on "
                        "to the next rank, so at step s rank r holds those of rank (r - s) mod world.",
    "ring_local": "local indices are compared (i >= j): the keys come from another rank, so compare the "
                  "global positions of query i and key j.",
    "chunk_window": "this is a sliding window, not a chunk: chunked attention sees keys j <= p of its own "
                    "chunk (j // chunk == p // chunk), so the first query of a chunk sees only itself.",
    "chunk_not_causal": "the chunk is bidirectional: query p must not see the keys after it in its chunk "
                        "(j <= p).",
    "chunk_top_left": "query i is placed at position i: the queries are the last Lq of the Lk positions, "
                      "query i at p = Lk - Lq + i (bottom-right).",
    "padchunk_from_zero": "the chunks are counted from the buffer's first position: a left-padded row's "
                          "chunks start at its first real token, so compare (j - pad) // chunk with "
                          "(p - pad) // chunk, pad the row's number of leading False.",
    "padchunk_pad_keys": "padding keys are attended: AND the chunked causal mask with the row's "
                         "attention_mask (a key that is padding is never seen).",
    "padchunk_all_false": "every False of the row is counted as left padding: only the leading False shift "
                          "the chunks (transformers counts the positions before the first real token); a "
                          "False after it is a masked key that shifts nothing.",
    "ring_source_plus_steps": MG.RING_SOURCE_PLUS,
    "ring_empty_steps": MG.RING_EMPTY_STEPS,
    "ring_layout": MG.RING_LAYOUT,
    "ring_local_steps": MG.RING_LOCAL,
    "ring_shard_order": MG.RING_SHARD_ORDER,
    "ring_no_merge": MG.RING_NO_MERGE,
    "ring_stale_lse": MG.RING_STALE_LSE,
    "ring_all_keys": "a rank's queries meet every key at once: out and lse are computed from all L keys "
                     "instead of merged from the steps, each of which holds one shard. Attend each step's "
                     "shard alone and merge the steps' (out, lse) with merge_partials.",
    "ring_one_pass": "the (L, L) scores are held at once: out and lse come from attention over all the "
                     "keys, not from the ring. Each rank holds one shard's keys at a step: its out and lse "
                     "are the merge of the partial results of the steps it ran, with your merge_partials.",
    "cascade_suffix_unmasked": "the suffix's padding keys are attended: sequence n has suffix_lengths[n] "
                               "real keys; mask the rest (a sequence with none has an all-False suffix "
                               "row, and its suffix lse is minus infinity).",
    "cascade_pairs_mixed": "the partial results are mixed up: merge_partials takes (out1, lse1, out2, lse2), "
                           "each output beside its own lse (the prefix's out with the prefix's lse).",
    "cascade_reshape": "the queries were reshaped from (N, H, d) to one block of H heads with N rows by "
                       "reshape/view: that mixes sequences and heads; swap the sequence and head dimensions "
                       "with a transpose, then add the batch dimension (and transpose back after).",
    "cascade_per_sequence": "the prefix is attended one sequence at a time: its keys are read N times. "
                            "Put the N queries side by side as the rows of one query block (a batch of one, "
                            "H heads, N rows) and attend the prefix once for all of them.",
    "cascade_prefix_copied": "the prefix is copied per sequence (expanded and concatenated with each "
                             "suffix, or repeated N times): its keys are read N times. Attend it once with "
                             "the N queries as one block of rows, and each suffix alone.",
}
