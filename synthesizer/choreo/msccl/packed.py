"""MSCCL XML gzipped as choreo sends and stores it, and a large file cut per node without
compressing anything again.

Level 1 (a ninth of the text at a quarter of level 6's time) and no timestamp, so the same
text always gives the same bytes. A large file is gzipped one member per part (its head, each
rank's ``<gpu>`` element, its tail): RFC 1952 lets members follow one another, so the whole is
one gzip file, and so is any run of them. A node's file is then its new head gzipped, its
ranks' members as they are and the tail's member.
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from choreo.errors import InputError
from choreo.msccl.split import TAIL, head_parts, node_head

_PIECE = 1 << 16  # bytes of compressed data inflated at a time


def gzip_xml(text: str) -> bytes:
    """``text`` as one gzip member."""
    return _gzip(text.encode())


def gzip_parts(text: str, cuts: Sequence[int]) -> tuple[bytes, list[int]]:
    """``text`` gzipped one member per part (cut at ``cuts``, offsets in characters: a
    tenant's name in the head may be any text), and where each member ends in bytes.
    Compressed on two threads: zlib lets go of the GIL."""
    bounds = [0, *cuts, len(text)]
    parts = [text[a:b].encode() for a, b in itertools.pairwise(bounds)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        members = list(pool.map(_gzip, parts, chunksize=64))
    return b"".join(members), list(itertools.accumulate(len(m) for m in members))


def inflate_xml(body: str | bytes) -> str:
    """The text of XML sent either way: gzip (bytes, any number of members) or plain."""
    return inflate(body).decode() if isinstance(body, bytes) else body


def inflate(data: bytes) -> bytes:
    """Every gzip member of ``data`` inflated, in order, each checked against its CRC and
    length. ``gzip.decompress`` copies the rest of the data at every member, which is
    quadratic in members (a 16,384-GPU file's 2,050 members of 125 MB: minutes); here each
    member is read in bounded pieces, so a member's end costs at most one piece's copy."""
    view = memoryview(data)
    out: list[bytes] = []
    at = 0
    while at < len(view):
        member = zlib.decompressobj(wbits=31)  # gzip framing: zlib checks the trailer
        while not member.eof:
            if at >= len(view):
                raise EOFError("compressed file ended before the end-of-stream marker")
            piece = view[at:at + _PIECE]
            out.append(member.decompress(piece))
            at += len(piece)
        at -= len(member.unused_data)
    return b"".join(out)


def split_members(body: bytes, ends: Sequence[int], node_of_rank: Sequence[str], *,
                  packed: bool) -> dict[str, str | bytes]:
    """node name -> its file (as ``split.split_per_node`` writes it) from a file gzipped by
    ``gzip_parts`` at a ``Lowering``'s cuts: gzipped (``packed``) by joining members, or
    plain by inflating only them. A node's ranks must be contiguous."""
    if len(ends) != len(node_of_rank) + 2 or not ends or ends[-1] != len(body):
        raise InputError(f"split: {len(ends)} gzip members for {len(node_of_rank)} ranks "
                         f"(a head, one per rank and a tail are needed)")
    starts = [0, *ends[:-1]]
    comment, algo_tag = head_parts(_inflate(body[:ends[0]]))
    tail = body[starts[-1]:]
    if _inflate(tail) != TAIL:
        raise InputError("split: the last gzip member is not the file's </algo>")
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for rank, name in enumerate(node_of_rank):
        if name in last and last[name] != rank - 1:
            raise InputError(f"split: node {name!r}'s ranks are not contiguous")
        first.setdefault(name, rank)
        last[name] = rank
    out: dict[str, str | bytes] = {}
    for name, lo in first.items():
        hi = last[name]
        head = node_head(comment, algo_tag, name, [str(r) for r in range(lo, hi + 1)])
        ranks = body[starts[lo + 1]:ends[hi + 1]]
        out[name] = (gzip_xml(head) + ranks + tail if packed
                     else head + _inflate(ranks) + TAIL)
    return out


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


def _inflate(members: bytes) -> str:
    try:
        return inflate(members).decode()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise InputError(f"split: a gzip member does not inflate: {err}") from None
