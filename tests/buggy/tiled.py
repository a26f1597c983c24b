"""The classic mistakes of chapter 8's ``tiled_attention``, each in otherwise correct
code: the online softmax with one step left out or off by one, and attention that
is right but not tiled."""

from __future__ import annotations

import math

import torch

from . import correct as ok


def _online(q, k, v, mask, tile, *, rescale_sum=True, guard=True, skip=True, stop=None, final_guard=True):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))
    x = q.float() / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for c in range(0, Lk if stop is None else stop(Lk, tile), tile):
        keep = None if mask is None else mask[..., c:c + tile]
        if skip and keep is not None and not keep.any():
            continue
        s = x @ k[:, :, c:c + tile].float().mT
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        shift = torch.where(torch.isinf(m_new), 0.0, m_new) if guard else m_new
        alpha = torch.exp(m - shift)
        p = torch.exp(s - shift)
        total = (total * alpha if rescale_sum else total) + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, c:c + tile].float()
        m = m_new
    out = acc / total.clamp(min=1.0) if final_guard else acc / total
    return out.to(q.dtype)


def tiled_no_rescale(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, rescale_sum=False)


def tiled_no_guard(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, guard=False)


def tiled_drops_last_tile(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, stop=lambda Lk, t: Lk - t + 1)  # only whole tiles


def tiled_pads_keys(q, k, v, mask=None, tile=64):
    """Pads k and v with zeros to a multiple of tile, and forgets to block the padding."""
    B, H, Lq, _ = q.shape
    Lk, extra = k.shape[2], -k.shape[2] % tile
    full = torch.ones(B, H, Lq, Lk, dtype=torch.bool, device=q.device) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk))
    k = torch.cat([k, k.new_zeros(B, H, extra, k.shape[-1])], dim=2)
    v = torch.cat([v, v.new_zeros(B, H, extra, v.shape[-1])], dim=2)
    full = torch.cat([full, torch.ones(B, H, Lq, extra, dtype=torch.bool, device=q.device)], dim=-1)
    return _online(q, k, v, full, tile)


def tiled_no_skip(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, skip=False)


def tiled_nan_rows(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, final_guard=False)


def tiled_full_scores(q, k, v, mask=None, tile=64):
    """Right values the chapter 2 way: the whole (B, H, Lq, Lk) score matrix at once."""
    return ok.attention(q, k, v, mask)[0]


def tiled_one_tile(q, k, v, mask=None, tile=64):
    """Right values, but every key in one tile: the whole score matrix again."""
    return ok.tiled_attention(q, k, v, mask, k.shape[2])


# --------------------------------------------------------------------------- tiled_attention_backward

def _backward(q, k, v, out, lse, d_out, mask, tile, *, row_term=True, scaled_scores=True, grad_scale=True,
              guard=True, skip="all", half=False, tile_softmax=False, fill=float("-inf")):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))
    f = q.dtype if half else torch.promote_types(q.dtype, torch.float32)
    x, g = q.to(f), d_out.to(f)
    delta = (g * out.to(f)).sum(-1, keepdim=True) if row_term else 0.0
    m = lse.to(f)[..., None]
    if guard:
        m = torch.where(torch.isinf(m), 0.0, m)
    dq = torch.zeros_like(x)
    dk = torch.zeros(B, H, Lk, d, dtype=f, device=q.device)
    dv = torch.zeros(B, H, Lk, v.shape[-1], dtype=f, device=q.device)
    for c in range(0, Lk, tile):
        keep = None if mask is None else mask[..., c:c + tile]
        seen = None if keep is None else keep if skip == "all" else keep[:, :1] if skip == "head0" else True
        if seen is not None and not bool(torch.as_tensor(seen).any()):
            continue
        kt, vt = k[:, :, c:c + tile].to(f), v[:, :, c:c + tile].to(f)
        s = x @ kt.mT / (math.sqrt(d) if scaled_scores else 1.0)
        if keep is not None:
            s = s.masked_fill(~keep, fill)
        if tile_softmax:  # the tile's own max and sum: what the forward's tile saw, not the row's
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        else:
            p = torch.exp(s - m)
        dv[:, :, c:c + tile] = p.mT @ g
        ds = p * (g @ vt.mT - delta)
        sc = 1 / math.sqrt(d) if grad_scale else 1.0
        dq += ds @ kt * sc
        dk[:, :, c:c + tile] = ds.mT @ x * sc
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def backward_fill_1e9(q, k, v, out, lse, d_out, mask=None, tile=64):
    """Blocked keys filled with -1e9 instead of -inf: they outweigh allowed scores below -1e9."""
    return _backward(q, k, v, out, lse, d_out, mask, tile, fill=-1e9)


def backward_no_row_term(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, row_term=False)


def backward_unscaled_scores(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, scaled_scores=False)


def backward_grads_unscaled(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, grad_scale=False)


def backward_nan_empty_rows(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, guard=False)


def backward_no_skip(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, skip="none")


def backward_skips_on_head0(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, skip="head0")


def backward_in_half(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, half=True)


def backward_tile_softmax(q, k, v, out, lse, d_out, mask=None, tile=64):
    return _backward(q, k, v, out, lse, d_out, mask, tile, tile_softmax=True)


def backward_autograd(q, k, v, out, lse, d_out, mask=None, tile=64):
    """Right gradients from autograd through plain attention: the whole (Lq, Lk) weights."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o = ok.attention(q, k, v, mask)[0]
        return torch.autograd.grad(o, (q, k, v), d_out)


def backward_keeps_weights(q, k, v, out, lse, d_out, mask=None, tile=64):
    """Each tile's weights kept and concatenated: the (Lq, Lk) matrix again."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    full = torch.ones(B, H, Lq, Lk, dtype=torch.bool, device=q.device) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk))
    m = torch.where(torch.isinf(lse), 0.0, lse.float())[..., None]
    x = q.float()
    tiles = [torch.exp((x @ k[:, :, c:c + tile].float().mT / math.sqrt(d)).masked_fill(
        ~full[..., c:c + tile], float("-inf")) - m) for c in range(0, Lk, tile)]
    p = torch.cat(tiles, dim=-1)  # (B, H, Lq, Lk)
    g = d_out.float()
    ds = p * (g @ v.float().mT - (g * out.float()).sum(-1, keepdim=True))
    return ((ds @ k.float() / math.sqrt(d)).to(q.dtype), (ds.mT @ x / math.sqrt(d)).to(k.dtype),
            (p.mT @ g).to(v.dtype))


# --------------------------------------------------------------------------- shortcuts: the wrong method

def tiled_keeps_tiles(q, k, v, mask=None, tile=64):
    """Each key tile's scores computed alone, then kept in a list and softmaxed together: the whole
    score matrix again, in pieces."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    full = torch.ones(B, H, Lq, Lk, dtype=torch.bool, device=q.device) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk))
    tiles = [(q.float() @ k[:, :, c:c + tile].float().mT / math.sqrt(d)).masked_fill(
        ~full[..., c:c + tile], float("-inf")) for c in range(0, Lk, tile)]
    s = torch.cat(tiles, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ v.float()).to(q.dtype)


def backward_autograd_tiled(q, k, v, out, lse, d_out, mask=None, tile=64):
    """Autograd through the student's own tiled forward, out and lse ignored: autograd keeps every
    tile's weights for its backward."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o = ok.tiled_attention(q, k, v, mask, tile)
        return torch.autograd.grad(o, (q, k, v), d_out)


def backward_vjp(q, k, v, out, lse, d_out, mask=None, tile=64):
    """torch.func.vjp through plain attention: autograd by another door."""
    _, pull = torch.func.vjp(lambda a, b, c: ok.attention(a, b, c, mask)[0], q, k, v)
    return pull(d_out)


def backward_recomputes_lse(q, k, v, out, lse, d_out, mask=None, tile=64):
    """The tiled backward, but out and lse recomputed by a forward pass instead of the given ones:
    right whenever they agree."""
    out, lse = ok.attention_lse(q, k, v, mask)
    return ok.tiled_attention_backward(q, k, v, out, lse, d_out, mask, tile)


def backward_recomputes_lse_tiled(q, k, v, out, lse, d_out, mask=None, tile=64):
    """The tiled backward after a tiled forward of its own (running max and sum kept): lse and out
    are what a forward gives, not what was given."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    full = None if mask is None else torch.broadcast_to(mask, (B, H, Lq, Lk))
    x = q.float() / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for c in range(0, Lk, tile):
        keep = None if full is None else full[..., c:c + tile]
        if keep is not None and not keep.any():
            continue
        s = x @ k[:, :, c:c + tile].float().mT
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha, p = torch.exp(m - shift), torch.exp(s - shift)
        total = total * alpha + p.sum(-1, keepdim=True)
        acc, m = acc * alpha + p @ v[:, :, c:c + tile].float(), m_new
    lse = torch.where(total > 0, torch.where(torch.isinf(m), 0.0, m) + total.log(), float("-inf"))[..., 0]
    out = (acc / total.clamp(min=1e-30)).to(q.dtype)
    return ok.tiled_attention_backward(q, k, v, out, lse, d_out, mask, tile)


# --------------------------------------------------------------------------- tiled_attention_fn (8.3)

def fn_no_function(q, k, v, mask=None, tile=64):
    """The tiled forward, differentiated by autograd: right gradients, every tile's weights kept."""
    return ok.tiled_attention(q, k, v, mask, tile)


class _AutogradBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, tile):
        ctx.save_for_backward(q, k, v, mask)
        return ok.tiled_attention(q, k, v, mask, tile)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, mask = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = ok.attention(q, k, v, mask)[0]
            return (*torch.autograd.grad(out, (q, k, v), d_out), None, None)


def fn_backward_by_autograd(q, k, v, mask=None, tile=64):
    """A Function whose backward is autograd through dense attention: the whole weights, rebuilt."""
    return _AutogradBackward.apply(q, k, v, mask, tile)


class _SavesWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, tile):
        B, H, Lq, d = q.shape
        s = q.float() @ k.float().mT / math.sqrt(d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        ctx.save_for_backward(q, k, v, p)
        return (p @ v.float()).to(q.dtype)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        g = d_out.float()
        ds = p * (g @ v.float().mT - (p * (g @ v.float().mT)).sum(-1, keepdim=True))
        scale = 1 / math.sqrt(q.shape[-1])
        return ((ds @ k.float() * scale).to(q.dtype), (ds.mT @ q.float() * scale).to(k.dtype),
                (p.mT @ g).to(v.dtype), None, None)


def fn_saves_weights(q, k, v, mask=None, tile=64):
    """A Function that keeps the (B, H, Lq, Lk) weights for its backward, as autograd would."""
    return _SavesWeights.apply(q, k, v, mask, tile)
