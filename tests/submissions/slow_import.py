"""Grader fixture: a top-level statement hangs, but politely: the cell's time limit stops it."""

import time

import torch

WAITING = time.sleep(3600)


def causal_mask(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] <= pos[:, None]
