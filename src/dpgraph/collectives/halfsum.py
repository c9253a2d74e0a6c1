"""The 16-bit all-reduce: 16-bit words on the wire, float32 sums, one rounding.

Gloo sums float16 one element at a time (a scalar half-precision loop, slower than moving
float32), and bfloat16 has no numpy dtype, so dpgraph's compressed gradients would otherwise
cost more than float32 ones.  A world whose backend can exchange buffers between ranks
(:meth:`BaseBackend._exchange_host`) reduces a 16-bit payload itself:

1. the local copies of the blob are summed in float32 (one copy: no arithmetic) and rounded
   once to the wire format: float16 (nearest even, as numpy's ``astype``) or bfloat16
   (:func:`dpgraph.ops.compress.round_to_bfloat16`), as 16-bit words;
2. reduce-scatter: the words are cut into ``size`` contiguous chunks (chunk ``k`` is
   ``[k * n // size, (k + 1) * n // size)``); every rank sends chunk ``k`` to rank ``k``;
3. rank ``k`` widens the ``size`` copies of its chunk to float32, adds them **in rank order
   0, 1, ..., size - 1** and rounds the float32 sum once to the wire format;
4. all-gather: every rank sends its rounded chunk to every other rank.

Each chunk is summed by one rank and copied to the others, so every rank ends with bitwise
the same result, whatever the arrival order: the sum is deterministic.  Each rank sends and
receives ``2 (size - 1) / size`` of the payload: half of float32's bytes.

Where the transport has a fast sum of the 16-bit type itself (Gloo's bfloat16 sum is a
shift and an add; see ``GlooBackend._native_16bit``), steps 2-4 are the transport's own
all-reduce of the words instead: each addition in float32, rounded to 16 bits (Gloo's ring
order), the same on every rank.  Gloo's float16 sum converts every element in software, which
costs more than the bytes it saves, so float16 takes steps 2-4.

Numerics: with two ranks and one local copy the result is bitwise Gloo's float16 sum
(``float16(float32(a) + float32(b))``: a float32 sum of two 16-bit values rounded to 16 bits
is the correctly rounded 16-bit sum, since float32 has more than twice their precision) and,
for bfloat16, bitwise the float32 all-reduce followed by the bfloat16 rounding of
``GradientDecompress`` (the path before the 16-bit wire).  With more ranks or several local
copies, steps 2-4 add the values in float32 in rank (and local copy) order and round once at
the end, where a 16-bit ring rounds after every addition: the results differ by at most the
16-bit rounding of the partial sums (the single rounding is never less accurate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import CollectiveError
from dpgraph.ops.compress import (
    TORCH_MIN_SIZE,
    from_bfloat16_bits,
    from_float16,
    to_bfloat16_bits,
    to_float16,
    torch_module,
)

#: Wire formats of the 16-bit all-reduce.
WIRE_DTYPES = ("float16", "bfloat16")

#: ``post(peer, array) -> handle``: start a send or a receive.
Post = Callable[[int, np.ndarray], Any]

#: Elements summed at a time (float32 work buffers that stay in the cache).
_PIECE = 1 << 17


def wire_format(buffer: Any, wire_dtype: str | None, what: str) -> str | None:
    """The 16-bit wire format of an all-reduce of ``buffer``'s dtype, or None (as it is).

    float16 buffers always travel as float16; float32 buffers travel as bfloat16 only when
    asked (``wire_dtype="bfloat16"``: their values are rounded to bfloat16 first).
    """
    dtype = getattr(buffer, "dtype", None)
    if not wire_dtype:
        return "float16" if dtype == np.float16 else None
    needs = {"float16": np.float16, "bfloat16": np.float32}.get(wire_dtype)
    if needs is None:
        raise CollectiveError(f"{what}: wire_dtype must be one of {list(WIRE_DTYPES)}, got "
                              f"{wire_dtype!r}.")
    if dtype != needs:
        raise CollectiveError(f"{what}: wire_dtype {wire_dtype!r} reduces {np.dtype(needs)} "
                              f"blobs, got {dtype}; compress the blob with GradientCompress "
                              "first or drop wire_dtype.")
    return wire_dtype


def chunk_bounds(count: int, size: int) -> list[int]:
    """Chunk ``k`` of ``count`` values over ``size`` ranks is ``[b[k], b[k + 1])``."""
    return [k * count // size for k in range(size + 1)]


class HalfSum:
    """One 16-bit all-reduce on rank ``rank`` of ``size`` (``scratch``: the world's reused
    work buffers, used by one collective at a time)."""

    def __init__(self, wire: str, rank: int, size: int, scratch: dict[Any, np.ndarray]) -> None:
        self.wire, self.rank, self.size, self._scratch = wire, rank, size, scratch

    # --- conversions ---------------------------------------------------------------------
    def widen(self, words: np.ndarray, out: np.ndarray) -> np.ndarray:
        """float32 of 16-bit words."""
        if self.wire == "float16":
            return from_float16(words.view(np.float16), out)
        return from_bfloat16_bits(words, out)

    def narrow(self, values: np.ndarray, out: np.ndarray) -> np.ndarray:
        """16-bit words of float32 values, rounded to nearest even."""
        if self.wire == "float16":
            to_float16(values, out.view(np.float16))
        else:
            to_bfloat16_bits(values, out)
        return out

    def scratch(self, name: str, count: int, dtype: Any) -> np.ndarray:
        """A reused 1-D work buffer of at least ``count`` values."""
        key = (name, np.dtype(dtype).str)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.size < count:
            buffer = self._scratch[key] = np.empty(count, dtype)
        return buffer[:count]

    # --- the three steps -----------------------------------------------------------------
    def local_payload(self, copies: Sequence[np.ndarray]) -> np.ndarray:
        """The 16-bit words (uint16, 1-D) of the float32 sum of the local copies; a single
        contiguous, writable float16 copy is used in place (its result is written back into
        it)."""
        first = copies[0]
        count = first.size
        if self.wire == "float16" and len(copies) == 1:
            if first.flags.c_contiguous and first.flags.writeable:
                return first.reshape(-1).view(np.uint16)
            payload = self.scratch("payload", count, np.uint16)
            np.copyto(payload.view(np.float16), first.reshape(-1))
            return payload
        payload = self.scratch("payload", count, np.uint16)
        if len(copies) == 1:  # bfloat16: round the float32 values
            return self.narrow(np.ascontiguousarray(first).reshape(-1), payload)
        total = self.scratch("total", count, np.float32)
        part = self.scratch("part", count, np.float32)
        for index, copy in enumerate(copies):
            flat = np.ascontiguousarray(copy).reshape(-1)
            if self.wire == "float16":
                self.widen(flat.view(np.uint16), total if index == 0 else part)
            else:
                np.copyto(total if index == 0 else part, flat)
            if index:
                total += part
        return self.narrow(total, payload)

    def allreduce(self, payload: np.ndarray, send: Post, recv: Post,
                  wait: Callable[[list[Any]], None]) -> None:
        """Reduce-scatter, float32 sum in rank order, all-gather: ``payload`` (every rank's
        16-bit words) becomes the rounded sum on every rank.  The all-gather's receives are
        posted before the sum, as soon as the chunks they overwrite have been sent."""
        bounds = chunk_bounds(payload.size, self.size)
        peers = [j for j in range(self.size) if j != self.rank]
        chunks = {j: payload[bounds[j]:bounds[j + 1]] for j in range(self.size)}
        mine = chunks[self.rank]
        count = mine.size
        received = self.scratch("received", count * len(peers), np.uint16)
        theirs = {j: received[i * count:(i + 1) * count] for i, j in enumerate(peers)}
        sent = [send(j, chunks[j]) for j in peers]
        arriving = [recv(j, theirs[j]) for j in peers]
        wait(sent)
        gathered = [recv(j, chunks[j]) for j in peers]
        wait(arriving)
        self.reduce_chunk(mine, theirs)
        wait([send(j, mine) for j in peers] + gathered)

    def reduce_chunk(self, mine: np.ndarray, theirs: dict[int, np.ndarray]) -> None:
        """``mine`` = the rounded float32 sum, in rank order, of every rank's copy of this
        rank's chunk, a cache-sized piece at a time."""
        torch = torch_module() if self.size == 2 and mine.size >= TORCH_MIN_SIZE else None
        if torch is not None:  # one addition: torch's half add is float32 rounded once
            dtype = torch.float16 if self.wire == "float16" else torch.bfloat16
            halves = [torch.from_numpy(w.view(np.int16)).view(dtype)
                      for w in (mine, theirs[1 - self.rank])]
            torch.add(halves[0], halves[1], out=halves[0])
            return
        total = self.scratch("acc", min(_PIECE, mine.size), np.float32)
        part = self.scratch("part", min(_PIECE, mine.size), np.float32)
        for start in range(0, mine.size, _PIECE):
            stop = min(start + _PIECE, mine.size)
            acc, tmp = total[:stop - start], part[:stop - start]
            for k in range(self.size):
                words = mine if k == self.rank else theirs[k]
                self.widen(words[start:stop], acc if k == 0 else tmp)
                if k:
                    acc += tmp
            self.narrow(acc, mine[start:stop])

    def deliver(self, payload: np.ndarray, buffers: Sequence[Any],
                copy_into: Callable[[Any, Any], None]) -> None:
        """Write the reduced words into every local copy (float16, or float32 for
        bfloat16), skipping a copy that already holds them."""
        shape = buffers[0].shape
        if self.wire == "float16":
            result = payload.view(np.float16).reshape(shape)
        else:
            first = buffers[0]
            target = first if isinstance(first, np.ndarray) and first.flags.c_contiguous \
                and first.flags.writeable else np.empty(shape, np.float32)
            result = self.widen(payload, target.reshape(-1)).reshape(shape)
        for buffer in buffers:
            if not (isinstance(buffer, np.ndarray) and _same_memory(buffer, result)):
                copy_into(buffer, result)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.__array_interface__["data"][0] == \
        b.__array_interface__["data"][0] and a.dtype.itemsize == b.dtype.itemsize
