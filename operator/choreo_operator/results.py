"""Schedules as immutable, content-hashed ConfigMaps, and the pod-side view of them.

One ConfigMap per schedule, named ``<job>-<hash>``, so the same schedule always lands in
the same object (a restart or retry can only find it already there, never duplicate it) and
a pod keeps the exact files it started with. XML keys are ``<collective>-<bucket>.xml``;
pods mount them with ``items[].path: msccl/<key>`` so ``MSCCL_ALGO_DIR=<mount>/msccl``
holds nothing but XML. When the files exceed what one ConfigMap holds (1 MiB), they are cut
per pod instead: a pod's part keeps only its ranks' ``<gpu>`` elements (a rank only reads its
own), under keys prefixed ``r<first rank>.``, and consecutive pods' parts share a ConfigMap
(``<job>-<hash>-r<its first rank>-<its last rank>``) up to the split size, so a 1,024-GPU
tenant's schedule is three objects to write, watch and collect rather than 128; each pod
mounts its own keys.

Packed schedules hold their XML compressed (zstd) under ``binaryData`` (a tenth of the bytes
or less, which the API server, etcd and every informer of ConfigMaps hold), and a sidecar in
each pod inflates them (``choreo_operator.unpack``); the rank table and the switch that
turns MSCCL off stay plain ``data``, which ``env[].valueFrom`` reads.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from choreo.msccl.packed import codec_of, inflate_xml, pack_xml, plain_size, split_members
from choreo.msccl.split import split_per_node
from choreo_api import API_VERSION, CollectiveJob, CollectiveSpec

SPLIT_BYTES = 900 * 1024  # below the 1 MiB object limit, leaving room for metadata
RANKS_KEY = "ranks.json"
LABEL_JOB = "choreo.dev/collectivejob"
LABEL_HASH = "choreo.dev/content-hash"
ANN_INPUTS = "choreo.dev/inputs-hash"
ANN_FABRIC = "choreo.dev/fabric-fingerprint"
MOUNT_PATH = "/etc/choreo"
MSCCL_DIR = "msccl"


NCCL_FASTER = "NcclFaster"  # NCCL is predicted to beat choreo's schedule there
CONFIGMAP_LIMIT = "ConfigMapLimit"  # the file would not fit a pod's ConfigMap beside larger sizes'


@dataclass(frozen=True)
class SizeRange:
    """Sizes ``min_bytes..max_bytes`` and who runs them: choreo's ``files``, or NCCL
    (no file: the MSCCL runtime falls back to NCCL) for the ``reason`` given."""

    min_bytes: int
    max_bytes: int
    nccl_runs: bool
    speedup_vs_nccl: float | None  # NCCL's predicted time over choreo's
    files: tuple[str, ...] = ()  # the XML keys serving these sizes, where choreo runs them
    reason: str = ""  # why NCCL runs them: NCCL_FASTER or CONFIGMAP_LIMIT

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"minBytes": self.min_bytes, "maxBytes": self.max_bytes,
                               "runs": "NCCL" if self.nccl_runs else "choreo"}
        if self.nccl_runs and self.reason:
            doc["reason"] = self.reason
        if self.speedup_vs_nccl is not None:
            doc["speedupVsNccl"] = round(self.speedup_vs_nccl, 4)
        return doc


@dataclass(frozen=True)
class CollectiveResult:
    """A collective's prediction at its largest size range, and who runs each range."""

    name: str
    size_bytes: int
    time_seconds: float
    busbw: float
    lower_bound_seconds: float
    fraction_of_bound: float
    nccl_time_seconds: float | None = None
    nccl_choice: str = ""
    sizes: tuple[SizeRange, ...] = ()
    engine: str = ""  # whose schedule serves ``size_bytes``

    @property
    def speedup_vs_nccl(self) -> float | None:
        if self.nccl_time_seconds is None or self.time_seconds <= 0:
            return None
        return self.nccl_time_seconds / self.time_seconds

    @property
    def nccl_ranges(self) -> tuple[SizeRange, ...]:
        return tuple(r for r in self.sizes if r.nccl_runs)

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "sizeBytes": self.size_bytes,
                               "predictedTimeSeconds": self.time_seconds,
                               "predictedBusBandwidthBytesPerSecond": self.busbw,
                               "lowerBoundSeconds": self.lower_bound_seconds,
                               "fractionOfBound": self.fraction_of_bound,
                               "sizes": [r.status() for r in self.sizes]}
        if self.engine:
            doc["engine"] = self.engine
        if self.speedup_vs_nccl is not None:
            doc.update(predictedNcclTimeSeconds=self.nccl_time_seconds,
                       ncclChoice=self.nccl_choice,
                       speedupVsNccl=round(self.speedup_vs_nccl, 4))
        return doc

    def summary(self) -> str:
        """For ``kubectl get``: bandwidth, bound and NCCL at the largest size range."""
        vs = self.speedup_vs_nccl
        if self.sizes and all(r.nccl_runs for r in self.sizes):
            return f"NCCL runs ({1 / vs:.2f}x faster than choreo)" if vs else "NCCL runs"
        text = f"{self.busbw / 1e9:.1f} GB/s ({self.fraction_of_bound:.0%} of bound"
        return text + (f", {vs:.2f}x NCCL)" if vs is not None else ")")


def nccl_runs(bucket: Any, ship_anyway: bool) -> bool:
    """Whether NCCL, not a file, serves ``bucket``'s sizes: the synthesizer shipped no file
    there, or this job does not want a file NCCL is predicted to beat."""
    p = bucket.prediction
    return bool(bucket.nccl_runs) or (not ship_anyway and bool(p.nccl_choice)
                                      and p.speedup_vs_nccl < 1)


class Files(Mapping[str, str]):
    """A schedule's XML files, each kept as the synthesizer sent it (compressed for any size
    that matters) and inflated whenever it is read; the digest of its text is kept from the
    first read. A schedule cut per pod is cut file by file, so the operator holds one file's
    text at a time beside the pieces, and never the text of a file left out for want of
    room: a 192-GPU tenant's first schedule is 67 MiB of XML (2.79 MiB a pod), of which at
    most 24 MiB fit its pods' ConfigMaps."""

    def __init__(self, files: Mapping[str, str | bytes] | None = None) -> None:
        self._files = dict(files or {})
        self._members: dict[str, tuple[int, ...]] = {}
        self._parts: dict[str, tuple[int, ...]] = {}  # the members' rank ends (none: per rank)
        self._digests: dict[str, str] = {}

    def __getitem__(self, key: str) -> str:
        body = self._files[key]
        text = inflate_xml(body)
        if key not in self._digests and key not in self._members:  # those hash their bytes
            self._digests[key] = _digest(text)
        return text

    def size(self, key: str) -> int:
        """Bytes of the file's text, without inflating it where its members say."""
        body = self._files[key]
        if isinstance(body, bytes):
            size = plain_size(body, self._members.get(key, (len(body),)))
            return len(self[key].encode()) if size is None else size
        return len(body.encode())

    def digest(self, key: str) -> str:
        """SHA-256 of the file's text (read once if it has not been); of a file sent in
        members, of its compressed bytes, which are as deterministic and need no inflating."""
        if key not in self._digests:
            body = self._files[key]
            if isinstance(body, bytes) and key in self._members:
                self._digests[key] = f"{codec_of(body)}:{hashlib.sha256(body).hexdigest()}"
            else:
                self[key]
        return self._digests[key]

    def per_node(self, key: str, node_of_rank: Sequence[str], packed: bool,
                 ) -> dict[str, str | bytes]:
        """node name -> the file with only that node's ranks: joined from the file's
        members where it was sent so (nothing is inflated, or only each node's own part),
        else cut from its text."""
        body = self._files[key]
        if isinstance(body, bytes) and key in self._members:
            return split_members(body, self._members[key], node_of_rank, packed=packed,
                                 part_ends=self._parts.get(key, ()))
        # The synthesizer's own lowering: the cut checks only what it relies on (expat
        # would take two thirds of the time).
        pieces: dict[str, str | bytes] = dict(split_per_node(self[key], node_of_rank,
                                                             check_xml=False))
        if packed:
            pieces = {node: pack_xml(str(text)) for node, text in pieces.items()}
        return pieces

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def packed(self, key: str) -> bytes:
        """The file compressed: as the synthesizer sent it, or now as it would."""
        body = self._files[key]
        return body if isinstance(body, bytes) else pack_xml(body)

    def add(self, key: str, body: str | bytes, member_ends: Sequence[int] = (),
            part_ends: Sequence[int] = ()) -> None:
        """A file as sent: plain text, or compressed (in members, ending at ``member_ends``,
        between head and tail one per rank or per part ending before ``part_ends``)."""
        self._files[key] = body
        if member_ends and isinstance(body, bytes):
            self._members[key] = tuple(member_ends)
            if part_ends:
                self._parts[key] = tuple(part_ends)

    def without(self, keys: Collection[str]) -> Files:
        kept = copy.copy(self)
        kept._files = {k: v for k, v in self._files.items() if k not in keys}
        kept._members = {k: v for k, v in self._members.items() if k not in keys}
        kept._parts = {k: v for k, v in self._parts.items() if k not in keys}
        kept._digests = {k: v for k, v in self._digests.items() if k not in keys}
        return kept


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Schedule:
    """One tenant's result: its files and predictions."""

    files: Files
    ranks: list[dict[str, Any]]
    collectives: list[CollectiveResult] = field(default_factory=list)
    verified: bool = True
    errors: list[str] = field(default_factory=list)
    dialect: str = "executor"
    packed: bool = False  # files gzipped, for pods with the sidecar that inflates them
    _digest: str = field(default="", init=False, repr=False, compare=False)

    def data(self) -> dict[str, str | bytes]:
        """The ConfigMap's keys, every file inflated (or gzipped, if packed). With no XML at
        all (NCCL is faster at every size) it also holds the switch that turns MSCCL off, for
        pods admitted before the schedule existed (they read it through ``env[].valueFrom``)."""
        files = ({k: self.files.packed(k) for k in self.files} if self.packed
                 else dict(self.files))
        return {**files, **self.besides()}

    def besides(self) -> dict[str, str]:
        """The keys of ``data()`` that are not XML files."""
        off = {} if self.files else dict.fromkeys(MSCCL_OFF[self.dialect], "0")
        return {**off, RANKS_KEY: json.dumps(self.ranks, separators=(",", ":"))}

    def content_hash(self) -> str:
        """Hash of ``data()``: of each key and its text's digest, so files already read (to
        be cut per pod) are not read again; taken once, as a 1024-GPU schedule holds 68 MB
        of XML and its files are complete before anything asks."""
        if not self._digest:
            h = hashlib.sha256(b"gzip\0" if self.packed else b"")
            besides = self.besides()
            for key in sorted({*self.files, *besides}):
                digest = _digest(besides[key]) if key in besides else self.files.digest(key)
                h.update(f"{key}\0{digest}\0".encode())
            self._digest = h.hexdigest()
        return self._digest


MAX_BUCKETS = 16  # the synthesizer's limit of size buckets per collective


def alias_name(job: str) -> str:
    """The job's mutable ConfigMap that always holds the current schedule."""
    return f"{job[:240]}-schedule"


def alias_body(job: CollectiveJob, whole: Mapping[str, Any], content_hash: str,
               ) -> dict[str, Any]:
    """The alias holding what ``whole``, a whole schedule's ConfigMap, holds."""
    body = _body(job, alias_name(job.name), {}, content_hash, "", "")
    body.pop("immutable")
    for section in ("data", "binaryData"):
        body[section] = dict(whole.get(section) or {})
    return body


def alias_patch(job: CollectiveJob, alias: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that makes an existing alias hold what ``alias`` holds: every key a
    schedule of the job may have that ``alias`` lacks is removed (from either section, so a
    switch between plain and packed schedules leaves no key in both)."""
    keys = (*possible_files(job), *MSCCL_OFF[job.spec.dialect], RANKS_KEY)
    return {section: {**dict.fromkeys(k for k in keys if k not in alias[section]),
                      **alias[section]} for section in ("data", "binaryData")} | {
        "metadata": {"labels": alias["metadata"]["labels"]}}


def possible_files(job: CollectiveJob) -> list[str]:
    """Every XML key a schedule of ``job`` can have, for mounting before it exists."""
    return [xml_key(c.name, b) for c in job.spec.collectives for b in range(MAX_BUCKETS)]


def xml_key(collective: str, bucket: int) -> str:
    return f"{collective}-{bucket}.xml"


def base_name(job: str, content_hash: str) -> str:
    return f"{job[:230]}-{content_hash[:10]}"


@dataclass(frozen=True)
class Part:
    """A pod's share of a schedule cut per pod: its keys in ConfigMap ``name`` start with
    ``prefix`` (other pods' parts may share that ConfigMap)."""

    name: str
    first: int
    last: int
    pod_rank: int  # the pod's rank label value, which the webhook sees at admission
    prefix: str = ""

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "firstRank": self.first, "lastRank": self.last,
                "podRank": self.pod_rank, "keyPrefix": self.prefix}


ConfigMaps = tuple[str, list[Part], list[dict[str, Any]]]  # base name, parts, bodies


def config_maps(job: CollectiveJob, schedule: Schedule, pod_ranks: Mapping[str, tuple[int, int]],
                pod_index: Mapping[str, int], inputs_hash: str, fingerprint: str,
                split_bytes: int = SPLIT_BYTES) -> tuple[Schedule, ConfigMaps]:
    """The ConfigMap bodies for a schedule, and the schedule they hold: split per pod, it
    may leave its smallest size ranges to NCCL (``fit_per_pod``). A body can still be over
    the limit (``oversized`` says so): a collective's largest range is never left out."""
    besides = schedule.besides()
    size = (sum(len(k) + (len(schedule.files.packed(k)) if schedule.packed
                          else schedule.files.size(k)) for k in schedule.files)
            + sum(len(k) + len(v) for k, v in besides.items()))
    if size <= split_bytes or not pod_ranks:
        data = schedule.data()
        digest = schedule.content_hash()
        name = base_name(job.name, digest)
        return schedule, (name, [], [_body(job, name, data, digest, inputs_hash, fingerprint)])
    # A part holds its pod's ranks, as its files hold only their <gpu> elements: the whole
    # map in each of a 1,024-GPU tenant's 128 parts was 52 KB, three times its XML.
    ranks = {first: json.dumps(schedule.ranks[first:last + 1], separators=(",", ":"))
             for first, last in pod_ranks.values()}
    longest = len(f"r{len(schedule.ranks)}.")  # the prefix of a part's keys, at most
    schedule, split = fit_per_pod(schedule, pod_ranks, (1 + len(schedule.files)) * longest
                                  + len(RANKS_KEY) + max(map(len, ranks.values())))
    digest = schedule.content_hash()
    name = base_name(job.name, digest)
    # Consecutive pods' parts fill ConfigMaps up to the split size, each named by the ranks
    # it holds: another cut of the same schedule (another --split-bytes) names other objects,
    # so one found already always holds what its name says.
    bins: list[list[tuple[str, int, int, dict[str, str | bytes]]]] = []
    held = 0  # bytes in the last one
    for pod, (first, last) in sorted(pod_ranks.items(), key=lambda x: x[1]):
        prefix = f"r{first}."
        files = {prefix + k: split[k][f"r{first}"] for k in schedule.files}
        files[prefix + RANKS_KEY] = ranks[first]
        size = sum(len(k) + _size(v) for k, v in files.items())
        if not bins or held + size > split_bytes:
            bins.append([])
            held = 0
        bins[-1].append((pod, first, last, files))
        held += size
    parts: list[Part] = []
    bodies: list[dict[str, Any]] = []
    for held_pods in bins:
        part = f"{name}-r{held_pods[0][1]}-{held_pods[-1][2]}"
        parts += [Part(part, first, last, pod_index.get(pod, first), f"r{first}.")
                  for pod, first, last, _ in held_pods]
        data = {k: v for *_, files in held_pods for k, v in files.items()}
        bodies.append(_body(job, part, data, digest, inputs_hash, fingerprint))
    return schedule, (name, parts, bodies)


def fit_per_pod(schedule: Schedule, pod_ranks: Mapping[str, tuple[int, int]], fixed: int,
                ) -> tuple[Schedule, dict[str, dict[str, str | bytes]]]:
    """Every file cut per pod (piece per pod, by ``r<first rank>``), largest size ranges
    first; once a range's pieces would take a pod's ConfigMap over the limit, that range and
    every smaller one are left to NCCL (``without``), their pieces never kept. A collective's
    largest range always stays. ``fixed``: the bytes every pod's ConfigMap holds besides.

    The smallest sizes go first: they are latency-bound, where a schedule gains least. Cut
    file by file, a tenant whose four size buckets need three times a ConfigMap holds one
    bucket's pieces at a time, not all four. A packed schedule's pieces are gzipped, and
    their room counted so."""
    part_of_rank = [""] * len(schedule.ranks)
    for first, last in pod_ranks.values():
        part_of_rank[first:last + 1] = [f"r{first}"] * (last + 1 - first)
    room = {f"r{first}": CONFIGMAP_MAX_BYTES - fixed for first, _ in pod_ranks.values()}
    shipped = [[r for r in c.sizes if r.files] for c in schedule.collectives]
    optional = sorted((r for rs in shipped for r in rs[:-1]), key=lambda r: -r.max_bytes)
    left = {k for r in optional for k in r.files}
    groups = [[k] for k in schedule.files if k not in left] + [list(r.files) for r in optional]
    split: dict[str, dict[str, str | bytes]] = {}
    for i, keys in enumerate(groups):
        pieces = {k: schedule.files.per_node(k, part_of_rank, schedule.packed) for k in keys}
        need = {pod: sum(len(k) + _size(p[pod]) for k, p in pieces.items()) for pod in room}
        if i >= len(groups) - len(optional) and any(need[p] > room[p] for p in room):
            return without(schedule, {k for g in groups[i:] for k in g}), split
        room = {p: room[p] - need[p] for p in room}
        split.update(pieces)
    return schedule, split


CONFIGMAP_MAX_BYTES = 1 << 20  # the API server's limit on a ConfigMap's data


def data_bytes(body: dict[str, Any]) -> int:
    """What the API server counts against a ConfigMap's limit: both sections, binaryData as
    the bytes its base64 stands for."""
    text = sum(len(k) + len(v.encode()) for k, v in (body.get("data") or {}).items())
    return text + sum(len(k) + len(v) * 3 // 4 - v[-2:].count("=")
                      for k, v in (body.get("binaryData") or {}).items())


def xml_files(body: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A ConfigMap's MSCCL files as a pod's runtime reads them (packed ones inflated): of the
    part whose keys start with ``prefix``, by their own names."""
    def own(section: str) -> Iterator[tuple[str, Any]]:
        return ((k[len(prefix):], v) for k, v in (body.get(section) or {}).items()
                if k.startswith(prefix) and k.endswith(".xml"))

    files = dict(own("data"))
    files.update((k, inflate_xml(base64.b64decode(v))) for k, v in own("binaryData"))
    return files


def _size(body: str | bytes) -> int:
    return len(body) if isinstance(body, bytes) else len(body.encode())


def without(schedule: Schedule, keys: set[str]) -> Schedule:
    """``schedule`` with the files ``keys`` left out: NCCL runs their sizes."""
    colls = [replace(c, sizes=tuple(
        replace(r, nccl_runs=True, files=(), reason=CONFIGMAP_LIMIT)
        if set(r.files) & keys else r for r in c.sizes)) for c in schedule.collectives]
    return replace(schedule, files=schedule.files.without(keys),
                   collectives=colls)


@dataclass(frozen=True)
class Trim:
    """What to ask the synthesizer for of a collective whose smallest sizes NCCL runs for
    want of room: sizes from ``floor`` up, in ``buckets`` size buckets. It holds while the
    collective's spec is ``spec``."""

    spec: CollectiveSpec
    floor: int
    buckets: int


def trims(job: CollectiveJob, schedule: Schedule) -> dict[str, Trim]:
    """The trims ``schedule`` calls for, by collective name."""
    specs = {c.name: c for c in job.spec.collectives}
    found = ((specs[c.name], [(r.min_bytes, r.max_bytes, r.reason) for r in c.sizes])
             for c in schedule.collectives)
    return {spec.name: trim for spec, ranges in found if (trim := _trim(spec, ranges))}


def resumed_trims(job: CollectiveJob) -> dict[str, Trim]:
    """The trims the job's status shows, for its collectives whose size range is still the
    one the status covers: a restarted operator or a new leader asks what was asked before."""
    specs = {c.name: c for c in job.spec.collectives}
    out = {}
    for c in (job.status.collectives or ()) if job.status else ():
        spec = specs.get(c.name or "")
        ranges = [(r.min_bytes or 0, r.max_bytes or 0, r.reason or "") for r in c.sizes or ()]
        if (spec and ranges and min(lo for lo, _, _ in ranges) == spec.min_bytes
                and max(hi for _, hi, _ in ranges) == spec.max_bytes
                and (trim := _trim(spec, ranges))):
            out[spec.name] = trim
    return out


def _trim(spec: CollectiveSpec, ranges: Sequence[tuple[int, int, str]]) -> Trim | None:
    cut = [hi for _, hi, why in ranges if why == CONFIGMAP_LIMIT]
    if not cut:
        return None
    floor = max(cut) + 1
    return Trim(spec, floor, sum(lo >= floor for lo, _, _ in ranges))


def oversized(bodies: Sequence[dict[str, Any]]) -> str:
    """Why these ConfigMaps cannot be created (one is over the API server's limit), or ""."""
    for body in bodies:
        size = data_bytes(body)
        if size > CONFIGMAP_MAX_BYTES:
            return (f"ConfigMap {body['metadata']['name']} would hold {size / 2**20:.2f} MiB, over "
                    "the 1 MiB a ConfigMap may hold even with one part per pod; lower "
                    "spec.collectives[].maxBytes or the operator's --max-buckets, or use "
                    "fewer GPUs per pod")
    return ""


def _body(job: CollectiveJob, name: str, data: Mapping[str, str | bytes], digest: str,
          inputs_hash: str, fingerprint: str) -> dict[str, Any]:
    """A ConfigMap of ``data``: text under ``data``, bytes (gzipped XML) under ``binaryData``."""
    binary = {k: base64.b64encode(v).decode() for k, v in data.items() if isinstance(v, bytes)}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": {LABEL_JOB: job.name[:63], LABEL_HASH: digest[:63],
                       "app.kubernetes.io/managed-by": "choreo-operator"},
            "annotations": {ANN_INPUTS: inputs_hash, ANN_FABRIC: fingerprint},
            "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": "CollectiveJob", "name": job.name,
                "uid": job.metadata.uid, "controller": True, "blockOwnerDeletion": False,
            }],
        },
        "data": {k: v for k, v in data.items() if isinstance(v, str)},
        "immutable": True,
    }
    if binary:
        body["binaryData"] = binary
    return body


def volume_items(files: Sequence[str], prefix: str = "") -> list[dict[str, str]]:
    """``items`` mapping every XML under ``msccl/`` and the rank table at the root, from the
    keys of a pod's part (``prefix``) where the schedule is cut per pod."""
    items = [{"key": prefix + k, "path": f"{MSCCL_DIR}/{k}"} for k in sorted(files)
             if k.endswith(".xml")]
    items.append({"key": prefix + RANKS_KEY, "path": RANKS_KEY})
    return items


# The runtime's switch, read at communicator creation (NCCL_PARAM adds the NCCL_ prefix;
# RCCL reads its own RCCL_ one too). The legacy runtime runs MSCCL only where NCCL_ALGO names
# it, so leaving that unset turns it off.
MSCCL_OFF = {"executor": ("NCCL_MSCCL_ENABLE",),
             "rccl": ("NCCL_MSCCL_ENABLE", "RCCL_MSCCL_ENABLE"), "legacy": ()}


def pod_env(files: Sequence[str], dialect: str) -> dict[str, str]:
    """What the dialect's runtime reads to load the files.

    The executor (and RCCL) load every file in ``MSCCL_ALGO_DIR`` and leave every other call
    to NCCL's own choice, NVLS, PAT and trees included, so ``NCCL_ALGO`` stays the pod's own.
    The legacy runtime (an NCCL 2.12 fork: rings and trees only) loads ``MSCCL_XML_FILES``
    and needs MSCCL in ``NCCL_ALGO``. With no file at all MSCCL is switched off: the executor
    fails communicator creation when ``MSCCL_ALGO_DIR`` does not exist.
    """
    xml = [f"{MOUNT_PATH}/{MSCCL_DIR}/{k}" for k in sorted(files) if k.endswith(".xml")]
    if not xml:
        return dict.fromkeys(MSCCL_OFF[dialect], "0")
    if dialect == "legacy":
        return {"MSCCL_XML_FILES": ":".join(xml), "NCCL_ALGO": "MSCCL,RING,TREE"}
    return {"MSCCL_ALGO_DIR": f"{MOUNT_PATH}/{MSCCL_DIR}"}
