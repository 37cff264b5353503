"""The manifest's ``compression`` of averaged tensors, as hivemind codecs: every rung of the ladder.

``make_compression`` picks the codec for a rung's name (``compression_ladder``):
hivemind's dense codecs (fp16, 8-bit), fixed to work under numpy >= 2.4, and
:class:`SparseTopK` for the sparse rungs, whose wire formats are in
``sparse.py``. Importing this module also replaces entries of
hivemind's registry, which decodes every tensor a peer receives (the averager
processes fork after the import): the fixed 8-bit decoders, and
:class:`SparseWire` for ``MEANSTD_16BIT``.

hivemind names the codec of every tensor by a protobuf enum it cannot extend;
the sparse formats travel under ``MEANSTD_16BIT`` (which p2ptrain never sends
otherwise), tagged by a magic prefix; :class:`SparseWire` still decodes
hivemind's own mean-std fp16 format.

A reducer refuses a part whose rung the run does not allow (:func:`allow_rungs`):
it logs one line and raises, and hivemind excludes that sender from the round.
That sender still reduces its own part (no codec sees its own values), a limit
shared with every other misbehaviour of a reducer (robust aggregation's
concern). Uncompressed parts (``none``) cannot be refused: state downloads
travel in the same format.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing
from typing import Iterable, Sequence

import numpy as np
import torch
from hivemind.compression import (
    BlockwiseQuantization,
    CompressionBase,
    CompressionInfo,
    Float16Compression,
    NoCompression,
    Quantile8BitQuantization,
    ScaledFloat16Compression,
    Uniform8BitQuantization,
)
from hivemind.compression import serialization as hivemind_serialization
from hivemind.proto import runtime_pb2

from p2ptrain.peers.compression.ladder import Rung, parse_rung
from p2ptrain.peers.compression.sparse import decode, encode_top_k, encode_union, is_sparse, part_rung

logger = logging.getLogger(__name__)


def _int64_at(buffer: bytes, offset: int = 0) -> int:
    return int(np.frombuffer(buffer, count=1, offset=offset, dtype=np.int64)[0])


class _CodebookExtract:
    """hivemind 1.1's ``Quantization.extract`` calls ``int()`` on a 1-element array,
    which numpy >= 2.4 refuses ("only 0-dimensional arrays..."): every 8-bit
    tensor a peer received failed. This is the same decoding with the header read
    as a scalar."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        codebook = np.frombuffer(buffer, offset=8, count=_int64_at(buffer), dtype=self.codebook_dtype)
        quantized = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        quantized = torch.as_tensor(quantized, dtype=torch.int64).reshape(tuple(serialized_tensor.size))
        codebook = torch.as_tensor(codebook).to(dtype=getattr(torch, serialized_tensor.dtype))
        return codebook[quantized].requires_grad_(serialized_tensor.requires_grad)


class Uniform8Bit(_CodebookExtract, Uniform8BitQuantization):
    """hivemind's uniform 8-bit quantization, readable under numpy >= 2.4."""


class Quantile8Bit(_CodebookExtract, Quantile8BitQuantization):
    """hivemind's quantile 8-bit quantization, readable under numpy >= 2.4."""


class Blockwise8Bit(BlockwiseQuantization):
    """hivemind's blockwise 8-bit quantization (bitsandbytes), readable under numpy >= 2.4."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        from bitsandbytes.functional import dequantize_blockwise
        from hivemind.compression.quantization import _BLOCKWISE_QUANTIZATION_BLOCKSIZE

        buffer = serialized_tensor.buffer
        absmax = np.frombuffer(buffer, offset=16, count=_int64_at(buffer), dtype=self.codebook_dtype)
        codebook = np.frombuffer(buffer, offset=16 + absmax.nbytes, count=_int64_at(buffer, 8), dtype=self.codebook_dtype)
        quantized = np.frombuffer(buffer, offset=16 + absmax.nbytes + codebook.nbytes, dtype=self.indices_dtype)
        result = dequantize_blockwise(
            torch.as_tensor(quantized).reshape(tuple(serialized_tensor.size)), absmax=torch.as_tensor(absmax),
            code=torch.as_tensor(codebook), blocksize=_BLOCKWISE_QUANTIZATION_BLOCKSIZE, nested=False,
        )
        return result.to(getattr(torch, serialized_tensor.dtype)).requires_grad_(serialized_tensor.requires_grad)


def make_compression(name: str, tensors: Sequence[torch.Tensor]) -> CompressionBase:
    """The hivemind compression for a rung's name (the manifest's ``compression``, or the rung
    a DiLoCo peer sends with).

    Float16Compression refuses bfloat16 tensors; bf16 is already two bytes a
    value, so bf16 tensors are sent as they are.

    :raises ValueError: with the accepted forms, for a name that is no rung.
    """
    rung = parse_rung(name)
    if rung.sparse:
        return SparseTopK(rung)
    if name == "fp16":
        if any(tensor.dtype == torch.bfloat16 for tensor in tensors):
            logger.info("Sending bfloat16 tensors uncompressed: they are already 16-bit")
            return NoCompression()
        return Float16Compression()
    if name == "uniform8bit":
        return Uniform8Bit()
    if name == "blockwise8bit":
        return Blockwise8Bit()
    return NoCompression()


# ----- which rungs this process's reducers accept -----------------------------------


class RungRefused(ValueError):
    """A sender's part was compressed with a rung this run does not allow."""


class WireCounters:
    """Payload bytes this process's averagers sent in sparse formats, and parts refused.

    Shared memory, allocated at import: the averager processes are forked from
    the worker afterwards, and their counts are what the worker reads.
    """

    def __init__(self):
        self._values = multiprocessing.RawArray(ctypes.c_uint64, 3)

    def add(self, which: int, amount: int) -> None:
        self._values[which] += amount

    @property
    def parts_bytes(self) -> int:
        """Bytes of sparse parts sent to reducers."""
        return int(self._values[0])

    @property
    def answers_bytes(self) -> int:
        """Bytes of answers sent to senders, as a reducer of sparse parts."""
        return int(self._values[1])

    @property
    def refused_parts(self) -> int:
        return int(self._values[2])


COUNTERS = WireCounters()
_PARTS, _ANSWERS, _REFUSED = 0, 1, 2
_allowed: set[str] | None = None
# the registry names of the dense rungs a reducer can tell apart on the wire ("none" it cannot)
_DENSE_TYPES = {"FLOAT16": "fp16", "UNIFORM_8BIT": "uniform8bit", "BLOCKWISE_8BIT": "blockwise8bit",
                "QUANTILE_8BIT": "quantile8bit"}


def _refuse(rung_name: str) -> None:
    COUNTERS.add(_REFUSED, 1)
    message = (f"refused an averaging part sent with compression {rung_name}: this run allows "
               f"{', '.join(sorted(_allowed or ()))}; the sender is left out of this round")
    logger.warning(message)
    raise RungRefused(message)


class _RefusingDense(CompressionBase):
    """A registry entry of a dense rung that refuses parts when the run does not allow that rung."""

    def __init__(self, inner: CompressionBase, rung_name: str):
        self.inner, self.rung_name = inner, rung_name
        self.compression_type = inner.compression_type

    def compress(self, tensor, info, allow_inplace=False):
        return self.inner.compress(tensor, info, allow_inplace)

    def extract(self, serialized_tensor):
        if _allowed is not None and self.rung_name not in _allowed:
            _refuse(self.rung_name)
        return self.inner.extract(serialized_tensor)

    def estimate_compression_ratio(self, info):
        return self.inner.estimate_compression_ratio(info)


def allow_rungs(names: Iterable[str] | None) -> None:
    """The rungs this process's reducers accept (None: any); call before the averager starts.

    Sparse rungs are checked when their parts are decoded; fp16 and the 8-bit rungs by
    wrapping hivemind's registry entries. ``none`` is always accepted (see the module doc).
    """
    global _allowed
    _allowed = None if names is None else {parse_rung(name).name for name in names}
    registry = hivemind_serialization._BASE_COMPRESSION_TYPES
    for type_name, rung_name in _DENSE_TYPES.items():
        entry = registry[type_name]
        if not isinstance(entry, _RefusingDense):
            registry[type_name] = _RefusingDense(entry, rung_name)


# ----- the sparse rungs' codecs --------------------------------------------------------

# hivemind cuts each tensor into parts of part_size_bytes / (element size * this ratio)
# values: 2**19 / (4 * 1/8) = 2**20 for float32, a multiple of every chunk size
PART_RATIO = 1 / 8


class SparseWire(ScaledFloat16Compression):
    """hivemind's registry entry for ``MEANSTD_16BIT``: decodes every sparse format (and
    hivemind's own mean-std fp16); compresses a reducer's answers in the union format."""

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        # hivemind serializes only a reducer's answers through the registry; a sender's
        # parts go through the averager's own codec (SparseTopK)
        message = encode_union(tensor)
        COUNTERS.add(_ANSWERS, message.ByteSize())
        return message

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        if not is_sparse(serialized_tensor):
            return super().extract(serialized_tensor)
        rung_name = part_rung(serialized_tensor)
        if rung_name is not None and _allowed is not None and rung_name not in _allowed:
            _refuse(rung_name)
        return decode(serialized_tensor)


class SparseTopK(CompressionBase):
    """The averager's codec for a sparse rung: a sender's parts in the top-k format.

    Args:
        rung: the sparse rung (``compression_ladder.parse_rung``).
    """

    compression_type = runtime_pb2.CompressionType.MEANSTD_16BIT

    def __init__(self, rung: Rung):
        if not rung.sparse:
            raise ValueError(f"{rung.name} is not a sparse rung")
        self.rung = rung

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        message = encode_top_k(tensor, self.rung)
        COUNTERS.add(_PARTS, message.ByteSize())
        return message

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        return SparseWire().extract(serialized_tensor)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return PART_RATIO

    def __repr__(self) -> str:
        return f"SparseTopK({self.rung.name})"


# hivemind decodes every received tensor through this registry (in the averager
# processes, which are forked after this import)
hivemind_serialization._BASE_COMPRESSION_TYPES.update(
    UNIFORM_8BIT=Uniform8Bit(), QUANTILE_8BIT=Quantile8Bit(), BLOCKWISE_8BIT=Blockwise8Bit(),
    MEANSTD_16BIT=SparseWire(),
)
