"""The manifest's ``compression`` of averaged tensors, as hivemind codecs that work under numpy >= 2.4.

``make_compression`` picks the codec for a manifest name; importing this module
also registers the fixed 8-bit decoders in hivemind's registry, which decodes
every tensor a peer receives (the averager processes fork after the import).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch
from hivemind.compression import (
    BlockwiseQuantization,
    CompressionBase,
    Float16Compression,
    NoCompression,
    Quantile8BitQuantization,
    Uniform8BitQuantization,
)
from hivemind.compression import serialization as hivemind_serialization
from hivemind.proto import runtime_pb2

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


# hivemind decodes every received tensor through this registry (in the averager
# processes, which are forked after this import)
hivemind_serialization._BASE_COMPRESSION_TYPES.update(
    UNIFORM_8BIT=Uniform8Bit(), QUANTILE_8BIT=Quantile8Bit(), BLOCKWISE_8BIT=Blockwise8Bit()
)


def make_compression(name: str, tensors: Sequence[torch.Tensor]) -> CompressionBase:
    """The hivemind compression for the manifest's ``compression`` name.

    Float16Compression refuses bfloat16 tensors; bf16 is already two bytes a
    value, so bf16 tensors are sent as they are.
    """
    if name == "fp16":
        if any(tensor.dtype == torch.bfloat16 for tensor in tensors):
            logger.info("Sending bfloat16 tensors uncompressed: they are already 16-bit")
            return NoCompression()
        return Float16Compression()
    if name == "uniform8bit":
        return Uniform8Bit()
    if name == "blockwise8bit":
        return Blockwise8Bit()
    if name == "none":
        return NoCompression()
    raise ValueError(f"unknown compression {name!r}: use none, fp16, uniform8bit or blockwise8bit")
