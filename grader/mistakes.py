"""The classic mistakes of attention masking, in plain words: what is wrong and what to do.

One definition each. The checks recognise a mistake by computing what it would have
returned (:func:`grader.diagnose.name_mistake`) and quote its message from here; the
error explanations (:func:`grader.errors.explain_error`) quote the same messages.
"""

from __future__ import annotations

#: The classic mistakes, in plain words: what is wrong and what to do.
MISTAKES: dict[str, str] = {
    "inverted": "the mask is inverted: it is True where attention must be blocked. "
                "The convention is True = may attend (PyTorch SDPA); flip it with ~mask.",
    "diagonal_excluded": "the diagonal is missing: query i must also see key i itself (j <= i, not j < i).",
    "wrong_triangle": "the triangle is on the wrong side: query i may see keys j <= i (the past), "
                      "not j >= i (the future). Use torch.tril, not torch.triu.",
    "no_mask": "nothing is masked: every query sees every key.",
    "no_causal": "the causal part is missing: query i must not see keys j > i.",
    "after_softmax": "the mask is applied after the softmax: masked keys still took part in the "
                     "normalisation, so the allowed weights no longer sum to 1. Fill the blocked scores "
                     "with -inf before the softmax.",
    "multiply_logits": "the scores are multiplied by the mask: a blocked score becomes 0, not -inf, so "
                       "blocked keys still get weight. Fill blocked scores with -inf (masked_fill) before "
                       "the softmax.",
    "zero_times_inf": "NaN appears where attention is allowed: 0 * -inf is NaN. Build the bias with "
                      "torch.where(mask, 0.0, float('-inf')) or masked_fill instead of multiplying.",
    "fill_not_negative": "blocked keys still get weight when the real scores are very negative: a finite "
                         "fill such as -1e4 is not below every score. Use float('-inf') or "
                         "torch.finfo(dtype).min.",
    "fill_overflow": "the fill value does not fit in this dtype (float16 ends at ±65504, so -1e9 overflows). "
                     "Use float('-inf') or torch.finfo(scores.dtype).min.",
    "nan_rows": "a fully masked row came back as NaN: the softmax subtracts the row's max first, and "
                "-inf - (-inf) is NaN. Return zeros for rows with no allowed key, and keep their gradient "
                "finite too: make such rows finite (e.g. 0) before the softmax, then zero their weights. "
                "Replacing the NaN afterwards (torch.where(mask.any(-1, keepdim=True), weights, 0)) is "
                "enough only if the -inf was filled in (masked_fill, torch.where), not added "
                "(scores + bias).",
    "nan_grads": "a row whose scores are all -inf has a NaN softmax, in the backward pass as in the forward "
                 "one. Replacing the NaN weights afterwards keeps the gradient finite only if the -inf was "
                 "filled in with masked_fill or torch.where, whose backward gives each filled score gradient "
                 "0. Added to the scores (scores + to_additive(mask), or a row max of -inf subtracted), the "
                 "-inf passes the NaN back to the scores, and on to q and k. Fill instead of adding, or make "
                 "such rows finite (e.g. 0) before the softmax.",
    "uniform_rows": "a fully masked row came back uniform (1/Lk each): a finite fill makes all blocked keys "
                    "equal again. Return zeros for rows with no allowed key.",
    "wrong_dim": "the softmax runs over the wrong dimension: normalise over the keys (dim=-1) so that "
                 "each query row sums to 1.",
    "scale_1_over_d": "the scores are scaled by 1/d; the contract says 1/sqrt(d).",
    "no_scale": "the scores are not scaled: multiply q @ k^T by 1/sqrt(d).",
    "scale_sqrt_D": "the scores are scaled by 1/sqrt(D), the model width; each head uses 1/sqrt(d) "
                    "with d = D // n_heads.",
    "queries_padded": "the padding masks query rows instead of key columns: a padded key must be hidden "
                      "from every query, so the padding part must broadcast as (B, 1, 1, L), not "
                      "(B, 1, L, 1). Padded query rows themselves stay unmasked.",
    "rows_padded_too": "padded query rows are masked: the contract masks only padded keys, broadcast as "
                       "(B, 1, 1, L), and a padded query row still sees the real keys before it (masking "
                       "the rows, with or without the keys, gives this same wrong mask).",
    "unreshaped_padding": "the (B, L) padding table was combined with the (L, L) causal mask without its "
                          "head and query axes: broadcasting lines shapes up from the right, so it is read "
                          "as (Lq, Lk) and query i gets the padding of sequence i. This runs only when B = L "
                          "or B = 1, and is right only when B = 1. Give it its axes first: "
                          "padding[:, None, None, :] is (B, 1, 1, L).",
    "shapes_clash": "two shapes do not broadcast: shapes line up from the right, and only a size-1 axis "
                    "stretches. For example, a (B, L) padding table meets an (L, L) causal mask on its last "
                    "two axes and clashes whenever B is neither 1 nor L: give it its head and query axes "
                    "first, padding[:, None, None, :], (B, 1, 1, L). Or the heads: multi-head scores must be "
                    "(B, H, Lq, Lk), the head axis in front of the positions; heads split by a view to "
                    "(B, L, H, d) alone give scores between heads, (B, L, H, H), which no mask fits.",
    "no_padding": "padding is ignored: key j of sequence b must be hidden when j >= lengths[b].",
    "padding_off_by_one": "the padding is off by one: positions j < lengths[b] are real "
                          "(not j <= lengths[b]).",
    "enc_causal": "the encoder self-attention mask has a causal part: the encoder reads its source in "
                  "both directions, so enc_self masks only the padded source keys.",
    "cross_causal": "the cross-attention mask has a causal part: every target position may read the whole "
                    "(real) source, so cross masks only the padded source keys.",
    "cross_wrong_lengths": "the cross-attention keys are source positions: pad them with src_lengths, "
                           "not tgt_lengths.",
    "default_device": "a tensor made for an argument that was left out (e.g. a mask when mask=None) is on "
                      "PyTorch's default device, the CPU, not the inputs' device: create it with "
                      "device=q.device (or the input at hand), or skip it when the argument is None.",
    "global_max": "the softmax's stabilising max was taken over the blocked entries too: when a blocked "
                  "score is much larger than the allowed ones, the allowed weights underflow to 0 (or "
                  "0/0 = NaN). Mask first (blocked scores -> -inf), then take the max, or let "
                  "torch.softmax do it after masked_fill.",
    "wrong_device": "the result is not on the input's device: create every tensor with "
                    "device=<input>.device.",
    "top_left": "the causal mask is aligned top-left: with T cached keys, new query i must see keys "
                "0 .. T + i (bottom-right alignment), not 0 .. i.",
    "window_off_by_one": "the window is off by one: it counts the query itself, so query i sees keys "
                         "i - window + 1 .. i (i - j < window, not i - j <= window).",
    "window_not_causal": "the window looks both ways: query i may see only keys j <= i with i - j < window.",
    "prefix_le": "the prefix is one key too long: the prefix is the keys j < prefix_len, "
                 "not j <= prefix_len.",
    "prefix_and": "the two rules are combined with AND: a key is visible when j <= i OR j < prefix_len.",
    "prefix_rows": "the prefix is applied to query rows: it is the prefix *keys* j < prefix_len that every "
                   "query may see.",
    "doc_no_causal": "the document mask is not causal: inside a document query i may only see keys j <= i.",
    "doc_contiguous": "documents are assumed to be contiguous runs: equal ids mean the same document even "
                      "when another document sits between them. Compare ids directly: "
                      "doc_ids[:, :, None] == doc_ids[:, None, :].",
    "no_rescale": "the running sums are not rescaled when the running max grows: before adding a tile's "
                  "terms, multiply the running sum l and the running output acc by exp(m_old - m_new), "
                  "so that everything summed so far is relative to the new max.",
    "tile_nan": "NaN appears in rows that have allowed keys: a tile in which every key of a row is blocked "
                "leaves that row's max at -inf, and exp(-inf - (-inf)) is NaN. Subtract 0 instead of the "
                "max where the max is -inf (torch.where(torch.isfinite(m_new), m_new, 0)).",
    "last_tile": "the last key tile is wrong when tile does not divide Lk: it must hold the Lk % tile keys "
                 "left over. Loop c over range(0, Lk, tile) and slice keys c:c + tile (slicing stops at Lk); "
                 "if you pad k and v instead, block the padded keys.",
    "full_scores": "the whole score matrix is held: at one moment the floating tensors the call created "
                   "and still held added up to half of the B·H·Lq·Lk scores or more (the matrix built "
                   "whole, or every tile's scores or weights kept, by a list or by autograd). Compute "
                   "the scores of one key tile at a time, of shape (B, H, Lq, tile), and keep only the "
                   "running max, sum and output from tile to tile (no float copy of the whole mask either).",
    "tile_not_skipped": "a key tile whose mask is all False is still read: its keys and values reach the "
                        "output (here they hold NaN, as an uninitialised cache may). Skip such a tile "
                        "before touching k and v: if not mask_tile.any(): continue.",
    "not_vectorised": "the code reads tensor values back into Python or onto the CPU (.item(), .tolist(), "
                      "int(t), .cpu(), or a loop or slice over a tensor). Build the mask with vectorised "
                      "comparisons, e.g. torch.arange(L, device=lengths.device) < lengths[:, None]: it then "
                      "works on any device without a GPU sync.",
    "mixed_devices": "tensors on different devices were mixed: a tensor you created is on the CPU while the "
                     "inputs are elsewhere. Create helper tensors with device=<input>.device.",
    "no_kernel": "torch has no kernel for this operation on these inputs, most often because of the "
                 "dtype (e.g. torch.tril on a uint16 tensor): build masks as torch.bool and scores in a "
                 "floating dtype.",
    "mixed_dtypes": "dtypes were mixed: a tensor you created (or a weight) has another dtype than the "
                    "inputs. Create helpers with dtype=<input>.dtype, or compute in float32 and cast the "
                    "result back.",
    "future_leak": "changing tokens at positions >= t changed the outputs at positions < t: the future "
                   "leaks into the past. Block every key j > i before the softmax.",
    "padding_leak": "changing padded tokens changed the outputs of real tokens: padded keys still get "
                    "weight. Block every key j >= lengths[b] before the softmax.",
    "in_place": "an input was changed in place (an operation ending in _, or x[...] = ...). Inputs must stay "
                "unchanged: use out-of-place operations (masked_fill, not masked_fill_) or work on a copy.",
    # find_leaking_layer (1.3)
    "leak_layer_after": "the answer is one layer too late: if layers[:k + 1] is the first prefix that "
                        "leaks, the leaking layer is k (layers count from 0), not the prefix's length.",
    "leak_whole_model": "only the whole model was measured: its output tells that the model leaks, not "
                        "where. Measure each prefix layers[:k + 1] in turn.",
    "leak_zero_threshold": "float noise was taken for a leak: an FFT convolution is causal, but its "
                           "influence above the diagonal is about 1e-7 of the largest, not 0. Compare with "
                           "1e-3 x the largest entry, not with 0.",
    "leak_lower_triangle": "the search looks below the diagonal (j < i: the past, which every layer may "
                           "read); the future of query i is the keys j > i, above the diagonal.",
    "leak_layer_alone": "each layer was measured alone at x: a layer's leak can depend on what reaches it "
                        "(the layers before may open or close it). Measure the prefix layers[:k + 1] "
                        "applied to x, as the statement defines.",
    "leak_threshold_divided": "the threshold does not scale with the model: an absolute threshold, or one "
                              "divided by the largest entry (1e-3 / I.max()), misses the leak of a model "
                              "scaled by 1e-4 and takes the float noise of a model scaled by 1e6 for one. "
                              "Compare with 1e-3 * I.max(), which scales as every entry does.",
    "leak_zero_matrix": "an influence matrix of zeros was taken for a leak: a model whose first layer "
                        "ignores its input has no influence at all, and 0 >= 0. The entry must be strictly "
                        "larger than 1e-3 x the largest (and nothing leaks when the largest is 0).",
    "leak_one_position": "a leak of one position was missed: the future of query i starts at j = i + 1, the"
                         " first diagonal above the main one, and a single entry there is a leak.",
    # leaks_across_padding (4.2)
    "pad_all_positions": "the padded positions were compared too: their outputs change with their own token "
                         "in every decoder, correct or not. Compare only the real positions (the last "
                         "lengths[b] of each row).",
    "pad_right_side": "the padding was taken to be on the right: this batch is left-padded, its real tokens "
                      "are the LAST lengths[b] of each row (positions >= L - lengths[b]).",
    "pad_first_row": "only the first sequence was tested: a leak shows only in rows that have padding, and "
                     "the first row may have none. Refill the padding of every row.",
    "pad_loose_tolerance": "a small leak was taken for float noise: the tolerance is far too loose (a leak "
                           "may move a real output by 0.01 or less). Compare with torch.allclose(rtol=1e-4,"
                           " atol=1e-5).",
    "pad_fixed_refill": "one fixed refilling missed a leak: a fixed rule can leave a pad's token as it was "
                        "(V - 1 - id at the middle id, 0 where the pad holds 0) or move it to an id with the "
                        "same embedding ((id + 1) % V where ids share one), so nothing moves. Change every "
                        "pad to another id drawn at random, and try a few refillings.",
    "pad_last_position": "only the last position was compared: a leak may reach earlier real positions and "
                         "not the last one (an attention that sees only its neighbours). Compare every real"
                         " position.",
    "pad_nearest_only": "only the pad next to the real tokens was refilled: a leak may come from any pad "
                        "(an attention sink at position 0, say). Refill every padding position.",
    "pad_exact": "float noise was taken for a leak: a correct decoder may reorder its arithmetic (e.g. "
                 "subtract a maximum that includes padded scores) and move real outputs by a relative 1e-6 "
                 "or less, which is about 1e-2 for outputs near 1e4. Compare with torch.allclose(rtol=1e-4,"
                 " atol=1e-5): not torch.equal, and not an absolute tolerance alone.",
    "first_layer_only": "only the first layer masks the padded keys: after it, the hidden states at padded "
                        "positions still carry what the padding held, and a later layer that does not mask "
                        "them reads it back into the real tokens. Every layer needs the key mask.",
    "mask_on_queries": "the padding mask hides padded queries (rows) instead of padded keys (columns): real "
                       "tokens still read the padding, and a padded row loses every key. The mask belongs on "
                       "the key axis, broadcast over the queries.",
    "full_as_partial": "full tiles are listed as partial: a tile whose every cell may attend needs no mask, "
                       "so it belongs in full_kv_indices only (a kernel then skips the mask there).",
    "empty_listed": "empty tiles are listed: a tile none of whose cells may attend is in neither list (a "
                    "kernel skips it).",
    "boundary_cells": "the last tiles are judged with cells past Lq or Lk: a boundary tile holds only "
                      "the cells inside the mask: full when all of those may attend, empty when none may.",
    "one_head_mask": "one head's (or one sequence's) mask is used for all: each (b, h) has its own mask and "
                     "its own lists.",
}
