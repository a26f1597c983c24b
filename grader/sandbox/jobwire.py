"""The job, from the trusted parent to the worker: a pickle whose tensors travel as raw bytes.

torch pickles each storage through ``torch.save`` (about 50 µs a tensor; a job holds some 800:
76 ms to write and read). Here each storage's bytes follow the pickle once and are rebuilt with
``torch.frombuffer``: the same tensors (dtype, shape, strides, offset, shared storages,
``requires_grad``) in 12 ms. Only the parent writes a job, so reading it is not restricted;
the worker's answers come back through :mod:`grader.sandbox.channel`, which is.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch


def _plain_cpu(t: Any) -> bool:
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided
            and not t.is_quantized and not t.is_conj() and not t.is_neg()
            and (t.is_leaf or not t.requires_grad))


class _Writer(pickle.Pickler):
    def __init__(self, file, raw: list[bytes]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.raw = raw
        self.storages: dict[tuple[int, int], int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not _plain_cpu(obj):
            return None  # anything else is pickled by torch itself
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        index = self.storages.get(key)
        if index is None:
            index = self.storages[key] = len(self.raw)
            flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            self.raw.append(flat.numpy().tobytes())
        return (index, obj.dtype, obj.storage_offset(), tuple(obj.shape), obj.stride(), obj.requires_grad)


class _Reader(pickle.Unpickler):
    def __init__(self, file, raw: list[bytes]):
        super().__init__(file)
        self.raw = raw
        self.storages: dict[int, torch.UntypedStorage] = {}

    def persistent_load(self, pid: Any) -> torch.Tensor:
        index, dtype, offset, shape, stride, requires_grad = pid
        storage = self.storages.get(index)
        if storage is None:
            data = self.raw[index]
            flat = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
                    else torch.empty(0, dtype=torch.uint8))
            storage = self.storages[index] = flat.untyped_storage()
        t = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
        return t.requires_grad_() if requires_grad else t


def dumps(obj: Any) -> bytes:
    """``obj`` (a job) as bytes for :func:`loads`."""
    raw: list[bytes] = []
    buf = io.BytesIO()
    _Writer(buf, raw).dump(obj)
    return pickle.dumps((buf.getvalue(), raw), protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """The object :func:`dumps` wrote (trusted bytes: the parent's own)."""
    body, raw = pickle.loads(data)
    return _Reader(io.BytesIO(body), raw).load()


#: Bytes of a part's length, before the part (:func:`frame`).
FRAME_HEADER = 8


def frame(obj: Any) -> bytes:
    """``obj`` as one part of a job on the worker's stdin: its length, then :func:`dumps`."""
    data = dumps(obj)
    return len(data).to_bytes(FRAME_HEADER, "big") + data


def read_frame(fd: int) -> Any:
    """The next part :func:`frame` wrote to ``fd``; EOFError if the pipe ends first."""
    size = int.from_bytes(_read_exactly(fd, FRAME_HEADER), "big")
    return loads(_read_exactly(fd, size))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the job's pipe ended {left} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
