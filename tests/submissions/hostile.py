"""Grader fixture: every exercise misbehaves in its own way, or is correct with side effects.

The grader must survive each one, charge only that exercise (with a plain
message) and still grade the others. Never import this file: it is only ever
run inside the grader's sandboxed worker.
"""

import ctypes
import math
import os
import subprocess
import sys
import threading
import time

import torch


def causal_mask(n, *, device=None):
    while True:  # an infinite loop the worker can interrupt
        pass


def influence_matrix(f, x):
    import attnmask  # off limits: the import is refused with the rule

    return attnmask.influence_matrix(f, x)


def to_additive(mask, dtype=torch.float32):
    while True:  # an infinite loop that swallows every interruption: the parent must kill it
        try:
            time.sleep(60)
        except BaseException:  # noqa: BLE001
            pass


def masked_softmax(scores, mask):
    os._exit(0)


def attention(q, k, v, mask=None):
    ctypes.string_at(0)  # segmentation fault


def padding_mask(lengths, max_len):
    sys.exit("bye")


def decoder_mask(lengths, max_len):
    raise KeyboardInterrupt


def encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len):
    return bytearray(3 * 2**30)  # 3 GiB at once: over the grader's memory limit


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    # Make every comparison say "equal", then return garbage.
    torch.allclose = lambda *a, **k: True
    torch.equal = lambda *a, **k: True
    torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
    return torch.zeros(x_q.shape, dtype=x_q.dtype)


class Liar(torch.Tensor):
    """A tensor that claims to equal anything."""

    def __eq__(self, other):
        return True

    def allclose(self, *args, **kwargs):
        return True


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k_all = torch.cat([k_cache, k_new], dim=2)
    v_all = torch.cat([v_cache, v_new], dim=2)
    return torch.zeros_like(q).as_subclass(Liar), k_all.as_subclass(Liar), v_all.as_subclass(Liar)


def sliding_window_mask(n, window, *, device=None):
    # Correct, but floods stdout and stderr.
    print("chatter " * 200_000)
    print("noise " * 200_000, file=sys.stderr)
    pos = torch.arange(n, device=device)
    i, j = pos[:, None], pos[None, :]
    return (j <= i) & (i - j < window)


def prefix_lm_mask(n, prefix_len, *, device=None):
    # Correct, with side effects that are not cheating.
    sys.stdin.read()
    subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threading.Thread(target=time.sleep, args=(300,)).start()
    os.chdir("/")
    os.environ["SOMETHING"] = "changed"
    pos = torch.arange(n, device=device)
    i, j = pos[:, None], pos[None, :]
    return (j <= i) | (j < prefix_len)


def document_mask(doc_ids):
    # Correct, but forges results files wherever it can and looks for secrets.
    forged = '{"score": 1000, "max_score": 1, "tests": []}'
    for folder in (os.getcwd(), os.environ.get("TMPDIR", "."), os.path.dirname(os.getcwd())):
        try:
            with open(os.path.join(folder, "results.json"), "w") as f:
                f.write(forged)
        except OSError:
            pass
    if "GRADER_SEED" in os.environ:
        return None  # a secret leaked into the sandbox
    L = doc_ids.shape[1]
    pos = torch.arange(L, device=doc_ids.device)
    causal = pos[None, :] <= pos[:, None]
    same = torch.eq(doc_ids[:, :, None], doc_ids[:, None, :])  # == was patched by multi_head_attention
    return (same & causal)[:, None]


_ = math.pi
