"""Sparse rungs on the wire: top-k per chunk with 2- or 4-bit codes (their hivemind codecs are in ``compression.py``).

How a sparse round is averaged (hivemind's butterfly all-reduce: every member
reduces one part of the tensors, ``hivemind/averaging/allreduce.py``):

1. Each peer picks what it sends *before* the round (``error_feedback.py``):
   in every chunk of ``chunk`` values of a tensor, the ``k`` largest in
   magnitude of (pseudo-gradient + what it did not send before), each
   quantized to a sign and one of ``2**(bits-1)`` magnitude levels of that
   chunk (:func:`sparsify`). Its averaged tensors hold exactly those values
   (zeros elsewhere), so hivemind's compression of them is lossless:
   :func:`sparsify` of a sparsified tensor returns it unchanged, bit for bit.
2. A sender's part (:func:`encode_top_k`, ``compression.SparseTopK``): per chunk the magnitude levels
   (float32), then the positions of the selected entries in the part,
   Elias-Fano coded (:func:`pack_positions`: ``low = floor(log2(chunk/k))``
   bits each plus a unary bitmap, about ``2 + log2(chunk/k)`` bits a position
   instead of ``log2(chunk)``), then their ``bits``-bit codes. Chunks start at
   multiples of ``chunk`` in each tensor; hivemind cuts tensors into parts of
   2**20 values (``compression.PART_RATIO``), a multiple of
   every chunk size, so chunks never straddle parts.
3. The reducer of a part adds the decoded tensors, weighted by the samples
   behind each (hivemind's ``TensorPartReducer``): the result is the weighted
   mean of the dequantized sparse tensors, and an entry a peer did not send
   counts as 0 in its contribution (as SparseLoCo averages).
4. The reducer answers each sender with the average minus what that sender
   sent (hivemind's delta protocol), in the sender's compression type, so
   through ``compression.SparseWire`` (:func:`encode_union`): the entries of the union of every
   sender's entries (Elias-Fano coded positions), each an 8-bit integer scaled
   by the largest magnitude of its chunk of 4096; every entry in 8 bits where
   that is smaller. A nonzero entry is never rounded to 0, so a peer's result
   has exactly the union's entries. Peers' results agree to within 1/254 of
   the chunk's largest answer, as with today's 8-bit rungs, whose answers
   pass through the same delta protocol.

Bytes a peer uploads per round, for N averaged values in a group of g peers
whose chosen entries are a share d = k/chunk of the values and whose union is a
share u <= min(1, g*d), with p(x) = x*(floor(log2(1/x)) + 1) + 2**-floor(log2(1/x))
bits of positions per value (``compression_ladder.upload_bytes_per_value``):
(g-1)/g * N * [p(d) + d*bits + 32*2**(bits-1)/chunk] / 8   (its parts)
+ (g-1)/g * N * [p(u) + 8*u + 32/4096] / 8                 (its answers).
With sparse2bit-64of4096 and 4 peers that is at most 0.75 * (0.021 + 0.111) =
0.099 bytes a value, against 6 for the fp32 all-reduce of one step: the answers
on the union, not the parts, are most of it.

Formats only (torch, numpy, hivemind's tensor message): the codecs that send and read them,
and the registry entries they replace, are in ``compression.py``.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch
from hivemind.proto import runtime_pb2

from p2ptrain.peers.compression.ladder import UNION_CHUNK, Rung, parse_rung

MAGIC = b"p2s"
KIND_TOP_K, KIND_UNION, KIND_DENSE = 1, 2, 3
# magic, kind, bits, log2(chunk), reserved, k
_TOP_K_HEADER = struct.Struct("<3sBBBHI")
# magic, kind, reserved
_UNION_HEADER = struct.Struct("<3sB")


def _pack(values: np.ndarray, width: int) -> bytes:
    """Non-negative integers below 2**width, ``width`` bits each, most significant first."""
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64)
    bits = ((values.astype(np.int64)[:, None] >> shifts) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1)).tobytes()


def _unpack(buffer: bytes, offset: int, count: int, width: int) -> tuple[np.ndarray, int]:
    """``count`` integers of ``width`` bits from ``buffer`` at ``offset``; and the offset after them."""
    size = (count * width + 7) // 8
    raw = np.frombuffer(buffer, dtype=np.uint8, count=size, offset=offset)
    bits = np.unpackbits(raw, count=count * width).reshape(count, width).astype(np.int64)
    return bits @ (1 << np.arange(width - 1, -1, -1, dtype=np.int64)), offset + size


def _low_bits(universe: int, count: int) -> int:
    return max(0, int(math.log2(universe / count))) if count else 0


def pack_positions(positions: np.ndarray, universe: int) -> bytes:
    """Ascending distinct positions below ``universe``, Elias-Fano coded: each position's low
    ``floor(log2(universe / count))`` bits, then its high part as unary gaps in a bitmap of
    ``count + (universe >> low) + 1`` bits: about ``2 + log2(universe / count)`` bits a position."""
    low = _low_bits(universe, len(positions))
    high = np.zeros(len(positions) + (universe >> low) + 1, dtype=np.uint8)
    high[(positions >> low) + np.arange(len(positions))] = 1
    return _pack(positions & ((1 << low) - 1), low) + np.packbits(high).tobytes()


def unpack_positions(buffer: bytes, offset: int, count: int, universe: int) -> tuple[np.ndarray, int]:
    """``count`` positions written by :func:`pack_positions`; and the offset after them."""
    low = _low_bits(universe, count)
    lows, offset = _unpack(buffer, offset, count, low)
    size = count + (universe >> low) + 1
    high = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8, count=(size + 7) // 8, offset=offset), count=size)
    return ((np.flatnonzero(high)[:count] - np.arange(count)) << low) | lows, offset + (size + 7) // 8


def chunk_k(length: int, rung: Rung) -> int:
    """Entries sent from a chunk of ``length`` values (a tensor's last chunk may be short)."""
    return max(1, min(length, math.ceil(rung.k * length / rung.chunk)))


def _rows(flat: torch.Tensor, rung: Rung) -> list[tuple[torch.Tensor, int]]:
    """The tensor's chunks as (rows of equal length, start offset): the full chunks, then the short last one."""
    full = flat.numel() // rung.chunk * rung.chunk
    rows = [(flat[:full].view(-1, rung.chunk), 0)] if full else []
    if full < flat.numel():
        rows.append((flat[full:].view(1, -1), full))
    return rows


def _quantize(values: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (sign bit, then magnitude level) and each row's magnitude levels (float32).

    The levels come from splitting the row's magnitudes at their mean, ``bits - 1``
    times (each group at its own mean), and are the groups' means: values that
    already sit on a row's levels split into the same groups, so quantizing
    dequantized values gives them back exactly. Means are taken in float64.
    """
    magnitudes = values.abs().double()
    group = torch.zeros(values.shape, dtype=torch.int64)
    ones = torch.ones_like(magnitudes)
    for level in range(bits - 1):
        groups = 1 << level
        sums = torch.zeros(values.shape[0], groups, dtype=torch.float64).scatter_add_(1, group, magnitudes)
        counts = torch.zeros(values.shape[0], groups, dtype=torch.float64).scatter_add_(1, group, ones)
        threshold = (sums / counts.clamp_min(1)).gather(1, group)
        group = group * 2 + (magnitudes > threshold).long()
    levels = 1 << (bits - 1)
    sums = torch.zeros(values.shape[0], levels, dtype=torch.float64).scatter_add_(1, group, magnitudes)
    counts = torch.zeros(values.shape[0], levels, dtype=torch.float64).scatter_add_(1, group, ones)
    codebook = (sums / counts.clamp_min(1)).float()
    codes = ((values < 0).long() << (bits - 1)) | group
    return codes, codebook


def _dequantize(codes: torch.Tensor, codebook: torch.Tensor, bits: int) -> torch.Tensor:
    magnitude = codebook.gather(1, codes & ((1 << (bits - 1)) - 1))
    return torch.where((codes >> (bits - 1)).bool(), -magnitude, magnitude)


def _select(flat: torch.Tensor, rung: Rung) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """Per group of equal chunks: (indices in chunk, codes, codebook, start offset)."""
    selected = []
    for rows, start in _rows(flat, rung):
        k = chunk_k(rows.shape[1], rung)
        indices = rows.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
        codes, codebook = _quantize(rows.gather(1, indices), rung.bits)
        selected.append((indices, codes, codebook, start))
    return selected


def _scatter(numel: int, rung: Rung, selected) -> torch.Tensor:
    flat = torch.zeros(numel, dtype=torch.float32)
    for indices, codes, codebook, start in selected:
        positions = indices + start + torch.arange(indices.shape[0]).unsqueeze(1) * rung.chunk
        flat[positions.reshape(-1)] = _dequantize(codes, codebook, rung.bits).reshape(-1)
    return flat


@torch.no_grad()
def sparsify(tensor: torch.Tensor, rung: Rung) -> torch.Tensor:
    """What a peer sends of ``tensor`` on a sparse rung, dequantized (float32, zeros elsewhere)."""
    flat = tensor.detach().reshape(-1).float().cpu()
    return _scatter(flat.numel(), rung, _select(flat, rung)).reshape(tensor.shape)


def _tensor_message(kind_buffer: bytes, tensor: torch.Tensor) -> runtime_pb2.Tensor:
    return runtime_pb2.Tensor(compression=runtime_pb2.CompressionType.MEANSTD_16BIT, buffer=kind_buffer,
                              size=tensor.shape, dtype="float32", requires_grad=False)


def _positions(selected, rung: Rung) -> torch.Tensor:
    """The selected entries' positions in the flat tensor, ascending."""
    return torch.cat([(indices + start + torch.arange(indices.shape[0]).unsqueeze(1) * rung.chunk).reshape(-1)
                      for indices, _, _, start in selected])


def encode_top_k(tensor: torch.Tensor, rung: Rung) -> runtime_pb2.Tensor:
    """A sender's part in the sparse top-k format (see the module doc)."""
    flat = tensor.detach().reshape(-1).float().cpu()
    selected = _select(flat, rung)
    codebooks = b"".join(codebook.numpy().tobytes() for _, _, codebook, _ in selected)
    codes = torch.cat([codes.reshape(-1) for _, codes, _, _ in selected]).numpy()
    header = _TOP_K_HEADER.pack(MAGIC, KIND_TOP_K, rung.bits, rung.index_bits, 0, rung.k)
    positions = pack_positions(_positions(selected, rung).numpy(), flat.numel())
    return _tensor_message(header + codebooks + positions + _pack(codes, rung.bits), tensor)


def _decode_top_k(buffer: bytes, numel: int) -> torch.Tensor:
    _, _, bits, index_bits, _, k = _TOP_K_HEADER.unpack_from(buffer)
    rung = parse_rung(f"sparse{bits}bit-{k}of{1 << index_bits}")
    full, tail = divmod(numel, rung.chunk)
    rows = full + (tail > 0)
    entries = full * chunk_k(rung.chunk, rung) + (chunk_k(tail, rung) if tail else 0)
    offset = _TOP_K_HEADER.size
    codebook = torch.from_numpy(np.frombuffer(buffer, np.float32, rows * rung.levels, offset).copy()).view(rows, rung.levels)
    positions, offset = unpack_positions(buffer, offset + rows * rung.levels * 4, entries, numel)
    codes, offset = _unpack(buffer, offset, entries, rung.bits)
    positions, codes = torch.from_numpy(positions), torch.from_numpy(codes)
    # the chunk of a position is its codebook's row (a short last chunk is the last row)
    values = _dequantize(codes.unsqueeze(1), codebook[positions // rung.chunk], rung.bits)
    flat = torch.zeros(numel, dtype=torch.float32)
    flat[positions] = values.squeeze(1)
    return flat


def encode_union(tensor: torch.Tensor) -> runtime_pb2.Tensor:
    """A reducer's answer: the nonzero entries, or every entry where that is smaller, as
    8-bit integers scaled by each chunk's largest magnitude (see the module doc)."""
    flat = tensor.detach().reshape(-1).float().cpu()
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % UNION_CHUNK)).view(-1, UNION_CHUNK)
    scales = padded.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    scaled = padded / scales.unsqueeze(1) * 127
    # a nonzero entry stays nonzero: the answer keeps which entries the group sent
    codes = (torch.sign(scaled) * scaled.abs().round().clamp(1, 127)).to(torch.int8).reshape(-1)[:flat.numel()]
    positions = flat.nonzero().view(-1).numpy()
    packed = pack_positions(positions, flat.numel())
    if len(packed) + len(positions) < flat.numel():
        body, kind = struct.pack("<I", len(positions)) + packed + codes[positions].numpy().tobytes(), KIND_UNION
    else:
        body, kind = codes.numpy().tobytes(), KIND_DENSE
    return _tensor_message(_UNION_HEADER.pack(MAGIC, kind) + scales.numpy().tobytes() + body, tensor)


def _decode_union(buffer: bytes, numel: int, kind: int) -> torch.Tensor:
    chunks = -(-numel // UNION_CHUNK)
    offset = _UNION_HEADER.size
    scales = torch.from_numpy(np.frombuffer(buffer, np.float32, chunks, offset).copy()) / 127
    offset += 4 * chunks
    if kind == KIND_DENSE:
        codes = torch.from_numpy(np.frombuffer(buffer, np.int8, numel, offset).astype(np.float32))
        return codes * scales.repeat_interleave(UNION_CHUNK)[:numel]
    (entries,) = struct.unpack_from("<I", buffer, offset)
    positions, offset = unpack_positions(buffer, offset + 4, entries, numel)
    positions = torch.from_numpy(positions)
    codes = torch.from_numpy(np.frombuffer(buffer, np.int8, entries, offset).astype(np.float32))
    flat = torch.zeros(numel, dtype=torch.float32)
    flat[positions] = codes * scales[positions // UNION_CHUNK]
    return flat


def is_sparse(serialized: runtime_pb2.Tensor) -> bool:
    """Whether ``serialized`` is in one of the sparse formats (they start with :data:`MAGIC`)."""
    return serialized.buffer[:3] == MAGIC


def part_rung(serialized: runtime_pb2.Tensor) -> str | None:
    """The rung a sender's top-k part was sent with (None for a reducer's answer)."""
    if serialized.buffer[3] != KIND_TOP_K:
        return None
    _, _, bits, index_bits, _, k = _TOP_K_HEADER.unpack_from(serialized.buffer)
    return f"sparse{bits}bit-{k}of{1 << index_bits}"


def decode(serialized: runtime_pb2.Tensor) -> torch.Tensor:
    """A tensor in any of the sparse formats."""
    buffer, shape = serialized.buffer, tuple(serialized.size)
    numel = math.prod(shape)
    kind = buffer[3]
    if kind == KIND_TOP_K:
        tensor = _decode_top_k(buffer, numel)
    elif kind in (KIND_UNION, KIND_DENSE):
        tensor = _decode_union(buffer, numel, kind)
    else:
        raise ValueError(f"unknown sparse format {kind}")
    return tensor.reshape(shape).to(getattr(torch, serialized.dtype or "float32"))
