"""Correct solutions written by hand, apart from each other and from the course's, in the
styles students reach for: a class for the similarity flags' false-flag rate.

``STUDENTS`` maps a student to the source they hand in (a few exercises each). With
:mod:`.correct` and :mod:`.native`, split among more students so that no two students
share a function, they make a class of independently written correct submissions
(tests/test_class_similarity.py checks that every function passes the public checks).
"""

STUDENTS = {
    "s01": '''
import math
import torch


def causal_mask(n, *, device=None):
    r = torch.arange(n, device=device)
    return r.unsqueeze(1) >= r.unsqueeze(0)


def masked_softmax(scores, mask):
    big = scores.to(torch.float32).masked_fill(mask.logical_not(), -math.inf)
    top = big.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(big - top)
    total = e.sum(dim=-1, keepdim=True)
    return (e / torch.where(total > 0, total, torch.ones_like(total))).to(scores.dtype)


def sliding_window_mask(n, window, *, device=None):
    pos = torch.arange(n, device=device)
    gap = pos.view(-1, 1) - pos.view(1, -1)
    return (gap >= 0) & (gap < window)
''',
    "s02": '''
import torch


def attention(q, k, v, mask=None):
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.size(-1) ** -0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)
    return torch.matmul(probs, v.float()).to(v.dtype), probs.to(q.dtype)


def prefix_lm_mask(n, prefix_len, *, device=None):
    m = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    m[:, :prefix_len] = True
    return m
''',
    "s03": '''
import torch


def decoder_mask(lengths, max_len):
    steps = torch.arange(max_len, device=lengths.device)
    real = steps.unsqueeze(0) < lengths.unsqueeze(1)  # (B, L) keys that are tokens
    past = steps.unsqueeze(1) >= steps.unsqueeze(0)  # (L, L)
    return past.unsqueeze(0).unsqueeze(0) & real.unsqueeze(1).unsqueeze(2)


def packed_labels(tokens, doc_ids, ignore_index=-100):
    out = torch.full_like(tokens, ignore_index)
    keep = doc_ids[:, :-1] == doc_ids[:, 1:]
    out[:, :-1] = tokens[:, 1:].masked_fill(~keep, ignore_index)
    return out
''',
    "s04": '''
import math
import torch


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    keys = torch.cat((k_cache, k_new), dim=-2)
    values = torch.cat((v_cache, v_new), dim=-2)
    past = k_cache.shape[-2]
    n = q.shape[-2]
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(past)
    s = (q.float() @ keys.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ values.float()).to(q.dtype), keys, values


def document_mask(doc_ids):
    n = doc_ids.size(1)
    tri = torch.tril(torch.ones(n, n, dtype=torch.bool, device=doc_ids.device))
    return torch.logical_and(doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2), tri).unsqueeze(1)
''',
    "s05": '''
import torch


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    batch, n_q, width = x_q.shape
    head = width // n_heads

    def split(x, w):
        return torch.einsum("bld,ed->ble", x, w).reshape(batch, -1, n_heads, head).permute(0, 2, 1, 3)

    q, k, v = split(x_q, w_q), split(x_kv, w_k), split(x_kv, w_v)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / head ** 0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    mixed = torch.einsum("bhqk,bhkd->bhqd", weights, v.float()).to(x_q.dtype)
    return torch.einsum("bld,ed->ble", mixed.permute(0, 2, 1, 3).reshape(batch, n_q, width), w_o)


def causal_mask(n, *, device=None):
    return ~torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
''',
    "s06": '''
import torch


def encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len):
    dev = src_lengths.device
    src_ok = torch.arange(src_len, device=dev).expand(len(src_lengths), src_len) < src_lengths.view(-1, 1)
    tgt_ok = torch.arange(tgt_len, device=dev).expand(len(tgt_lengths), tgt_len) < tgt_lengths.view(-1, 1)
    lower = torch.ones(tgt_len, tgt_len, dtype=torch.bool, device=dev).tril()
    enc = src_ok.view(-1, 1, 1, src_len)
    dec = lower.view(1, 1, tgt_len, tgt_len) & tgt_ok.view(-1, 1, 1, tgt_len)
    return enc, dec, enc


def to_additive(mask, dtype=torch.float32):
    neg = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
    return torch.where(mask, torch.zeros_like(neg), neg)
''',
    "s07": '''
import torch


def image_text_mask(is_image, attention_mask):
    B, L = is_image.shape
    starts = is_image.clone()
    starts[:, 1:] = is_image[:, 1:] & ~is_image[:, :-1]
    block = torch.cumsum(starts.int(), dim=1).masked_fill(~is_image, -1)  # (B, L); -1 for text
    both = (block.unsqueeze(2) == block.unsqueeze(1)) & (block.unsqueeze(2) >= 0)
    seen = torch.arange(L, device=is_image.device)
    earlier = seen.view(L, 1) >= seen.view(1, L)
    return ((earlier.unsqueeze(0) | both) & attention_mask.bool().unsqueeze(1)).unsqueeze(1)


def left_padding_position_ids(keep):
    return (torch.cumsum(keep.long(), -1) - 1).clamp(min=0) * keep.long()
''',
    "s08": '''
import torch


def rolling_cache_mask(slot_pos, q_pos, window):
    slots = slot_pos.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, W)
    queries = q_pos.unsqueeze(1).unsqueeze(3)  # (B, 1, Lq, 1)
    filled = slots.ge(0)
    return filled.logical_and(slots.le(queries)).logical_and(queries.sub(slots).lt(window))


def tree_mask(parents, past_len):
    n = parents.shape[0]
    idx = torch.arange(n, device=parents.device)
    reach = (parents.unsqueeze(1) == idx.unsqueeze(0)) | torch.eye(n, dtype=torch.bool, device=parents.device)
    for _ in range(n):  # transitive closure: ancestors of ancestors
        reach = reach | ((reach.float() @ reach.float()) > 0)
    prefix = torch.ones(n, past_len, dtype=torch.bool, device=parents.device)
    return torch.cat([prefix, reach], dim=1)
''',
    "s09": '''
import math
import torch


def masked_softmax(scores, mask):
    work = scores.double()
    work[~mask.expand_as(work)] = -math.inf
    w = work.softmax(dim=-1).masked_fill(~mask.expand_as(work).any(-1, keepdim=True), 0.0)
    return w.to(scores.dtype)


def padding_mask(lengths, max_len):
    idx = torch.arange(max_len, device=lengths.device).repeat(lengths.shape[0], 1)
    return idx < lengths.reshape(-1, 1)
''',
    "s10": '''
import math
import torch


def attention(q, k, v, mask=None):
    scale = 1.0 / math.sqrt(k.shape[-1])
    s = torch.einsum("...qd,...kd->...qk", q.float(), k.float()) * scale
    if mask is None:
        mask = torch.ones_like(s, dtype=torch.bool)
    mask = mask.expand_as(s)
    s = torch.where(mask, s, torch.full_like(s, -math.inf))
    row_max = s.max(dim=-1, keepdim=True).values
    row_max = row_max.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    e = torch.exp(s - row_max) * mask
    w = e / e.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    return torch.einsum("...qk,...kd->...qd", w, v.float()).to(q.dtype), w.to(q.dtype)


def sliding_window_mask(n, window, *, device=None):
    full = torch.ones(n, n, dtype=torch.bool, device=device)
    return full.tril() & full.triu(1 - window)
''',
    "s11": '''
import torch


def document_mask(doc_ids):
    B, L = doc_ids.shape
    q = doc_ids.view(B, 1, L, 1)
    k = doc_ids.view(B, 1, 1, L)
    i = torch.arange(L, device=doc_ids.device)
    return (q == k) & (i.view(L, 1) >= i.view(1, L))


def prefix_lm_mask(n, prefix_len, *, device=None):
    i = torch.arange(n, device=device).view(n, 1)
    j = torch.arange(n, device=device).view(1, n)
    return torch.logical_or(j <= i, j < prefix_len)


def decoder_mask(lengths, max_len):
    pad = torch.arange(max_len, device=lengths.device) < lengths[:, None]  # (B, L)
    tri = torch.ones(max_len, max_len, dtype=torch.bool, device=lengths.device).tril()
    return tri[None, None] * pad[:, None, None, :]
''',
    "s12": '''
import math
import torch


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    T = k_cache.size(2)
    n = k_new.size(2)
    k = torch.cat([k_cache, k_new], 2)
    v = torch.cat([v_cache, v_new], 2)
    qi = torch.arange(T, T + n, device=q.device).view(-1, 1)
    kj = torch.arange(T + n, device=q.device).view(1, -1)
    logits = torch.matmul(q.float(), k.float().transpose(2, 3)).div(math.sqrt(q.size(-1)))
    logits = logits.masked_fill(kj > qi, -math.inf)
    return torch.matmul(logits.softmax(-1), v.float()).type_as(q), k, v


def packed_labels(tokens, doc_ids, ignore_index=-100):
    nxt = torch.roll(tokens, -1, dims=1)
    same = torch.roll(doc_ids, -1, dims=1) == doc_ids
    same[:, -1] = False
    return torch.where(same, nxt, ignore_index)
''',
    "s13": '''
import torch


def padding_mask(lengths, max_len):
    return lengths.unsqueeze(-1) > torch.arange(max_len, device=lengths.device)


def padded_encoder(x, lengths, weights):
    n_layers = weights.shape[0]
    keep = padding_mask(lengths, x.size(1)).unsqueeze(1)  # (B, 1, L)
    out = x
    for n in range(n_layers):
        wq, wk, wv = weights[n].unbind(0)
        logits = torch.einsum("bid,bjd->bij", out @ wq, out @ wk) * x.size(-1) ** -0.5
        logits = torch.where(keep, logits, torch.finfo(logits.dtype).min)
        out = out + torch.einsum("bij,bjd->bid", logits.softmax(dim=-1), out @ wv)
    return out


def tile_lists(mask, tile=64):
    B, H, Lq, Lk = mask.shape
    nq = (Lq + tile - 1) // tile
    nk = (Lk + tile - 1) // tile
    m = torch.nn.functional.pad(mask.float(), (0, nk * tile - Lk, 0, nq * tile - Lq), value=-1.0)
    m = m.reshape(B, H, nq, tile, nk, tile).permute(0, 1, 2, 4, 3, 5).flatten(-2)
    real = m >= 0
    some = (m > 0).any(-1)
    every = (m > 0).eq(real).all(-1)
    res = []
    for keep in (some & ~every, every):
        order = torch.argsort(keep.logical_not().long() * nk + torch.arange(nk, device=mask.device), dim=-1)
        res.append(keep.sum(-1, dtype=torch.int32))
        res.append(order.to(torch.int32))
    return tuple(res)
''',
}
