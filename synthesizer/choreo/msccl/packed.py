"""MSCCL XML compressed as choreo sends and stores it, and a large file cut per node without
compressing anything again.

zstd (RFC 8878) at level 3 with checksums is what choreo writes: on a 1,024-GPU schedule it
takes a quarter of gzip level 1's time and, one frame per node, 40% of its bytes, which is
what every ConfigMap write, etcd and each kubelet carry. gzip (level 1, no timestamp) stays
for clients that ask for it and schedules stored before. Either way the same text always
gives the same bytes, and the reader tells them apart by their magic.

A large file is compressed one member (gzip) or frame (zstd) per part: its head, each part's
``<gpu>`` elements (one rank's, or the ranks of a pod the client named), its tail. Both
formats let members follow one another and read as one file, and so does any run of them: a
node's file is its new head compressed, its parts' members as they are and the tail's.
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import zstandard

from choreo.errors import InputError
from choreo.msccl.split import TAIL, head_parts, node_head

Codec = Literal["zstd", "gzip"]
CODECS: tuple[Codec, ...] = ("zstd", "gzip")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_LEVEL = 3  # zstd's default: level 6 saves another third of the bytes at four times the time
_PIECE = 1 << 16  # bytes of compressed data inflated at a time


def pack_xml(text: str, codec: Codec = "zstd") -> bytes:
    """``text`` as one member."""
    return _compress(text.encode(), codec)


def pack_members(parts: Sequence[bytes | memoryview], codec: Codec = "zstd",
                 ) -> tuple[bytes, list[int]]:
    """Each part compressed as one member, the members joined, and where each ends.
    Compressed on two threads: zlib and zstd let go of the GIL."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        members = list(pool.map(lambda p: _compress(p, codec), parts, chunksize=16))
    return b"".join(members), list(itertools.accumulate(len(m) for m in members))


def codec_of(body: bytes) -> Codec:
    """The codec a body was compressed with, from its first member's magic."""
    return "zstd" if body[:4] == ZSTD_MAGIC else "gzip"


def inflate_xml(body: str | bytes) -> str:
    """The text of XML sent either way: compressed (bytes, any number of members) or plain."""
    return inflate(body).decode() if isinstance(body, bytes) else body


def inflate(data: bytes) -> bytes:
    """Every member of ``data`` inflated, in order, each checked against its checksum and
    length. ``gzip.decompress`` copies the rest of the data at every member, which is
    quadratic in members (a 16,384-GPU file's 2,050 members of 125 MB: minutes); here each
    member is read in bounded pieces, so a member's end costs at most one piece's copy."""
    view = memoryview(data)
    out: list[bytes] = []
    at = 0
    while at < len(view):
        member: zlib._Decompress | zstandard.ZstdDecompressionObj
        if view[at:at + 4] == ZSTD_MAGIC:
            member = zstandard.ZstdDecompressor().decompressobj()
        else:  # gzip framing: zlib checks the trailer
            member = zlib.decompressobj(wbits=31)
        while not member.eof:
            if at >= len(view):
                raise EOFError("compressed file ended before the end-of-stream marker")
            piece = view[at:at + _PIECE]
            out.append(member.decompress(piece))
            at += len(piece)
        at -= len(member.unused_data)
    return b"".join(out)


def plain_size(body: bytes, ends: Sequence[int]) -> int | None:
    """Bytes of the text of ``body`` (members ending at ``ends``) from the members' own
    records, without inflating: gzip's ISIZE (exact below 4 GiB), zstd's content size
    (which choreo always writes). None where a zstd frame does not record it."""
    total = 0
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        if body[start:start + 4] != ZSTD_MAGIC:
            total += int.from_bytes(body[end - 4:end], "little")
            continue
        size = zstandard.frame_content_size(body[start:end])
        if size < 0:
            return None
        total += size
    return total


def split_members(body: bytes, ends: Sequence[int], node_of_rank: Sequence[str], *,
                  packed: bool, part_ends: Sequence[int] = ()) -> dict[str, str | bytes]:
    """node name -> its file (as ``split.split_per_node`` writes it) from a file compressed
    one member per part (``Lowering.packed``): compressed (``packed``) by joining members,
    or plain by inflating only them. The members between head and tail hold one rank each,
    or the ranks up to each of ``part_ends`` (exclusive); a node's ranks must be a run of
    whole parts."""
    part_ends = list(part_ends) or list(range(1, len(node_of_rank) + 1))
    if (len(ends) != len(part_ends) + 2 or not ends or ends[-1] != len(body)
            or not part_ends or part_ends[-1] != len(node_of_rank)):
        raise InputError(f"split: {len(ends)} members for {len(part_ends)} parts of "
                         f"{len(node_of_rank)} ranks (a head, one per part and a tail)")
    # rank where a part starts -> its member, rank where one ends -> its member
    opens = {start: i + 1 for i, start in enumerate([0, *part_ends[:-1]])}
    closes = {end: i + 1 for i, end in enumerate(part_ends)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for rank, name in enumerate(node_of_rank):
        if name in last and last[name] != rank - 1:
            raise InputError(f"split: node {name!r}'s ranks are not contiguous")
        first.setdefault(name, rank)
        last[name] = rank
    starts = [0, *ends[:-1]]
    codec = codec_of(body)
    comment, algo_tag = head_parts(_inflate(body[:ends[0]]))
    tail = body[starts[-1]:]
    if _inflate(tail) != TAIL:
        raise InputError("split: the last member is not the file's </algo>")
    out: dict[str, str | bytes] = {}
    for name, lo in first.items():
        hi = last[name]
        if lo not in opens or hi + 1 not in closes:
            raise InputError(f"split: node {name!r}'s ranks {lo}-{hi} are not whole parts")
        head = node_head(comment, algo_tag, name, [str(r) for r in range(lo, hi + 1)])
        ranks = body[starts[opens[lo]]:ends[closes[hi + 1]]]
        out[name] = (pack_xml(head, codec) + ranks + tail if packed
                     else head + _inflate(ranks) + TAIL)
    return out


def _compress(data: bytes | memoryview, codec: Codec) -> bytes:
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(data)
    return gzip.compress(data, compresslevel=1, mtime=0)


def _inflate(members: bytes) -> str:
    try:
        return inflate(members).decode()
    except (OSError, EOFError, zlib.error, zstandard.ZstdError, UnicodeDecodeError) as err:
        raise InputError(f"split: a member does not inflate: {err}") from None
