"""Loading at the cost of the weights: modules built without initialisation, tensors streamed from
the files straight into the requested dtype and device.

1. ``skeleton(factory)`` builds a module whose parameters are on the meta device (no memory, and
   the constructors' ``nn.init`` calls do nothing); buffers the constructors compute (RoPE tables,
   token maps, diffusion schedules) are built as usual, so nothing has to recompute them later.
2. A source yields ``(file key, tensor)`` pairs whose data is memory-mapped: ``safetensors_tensors``
   (``safe_open``, shard by shard: a shard is closed before the next one opens) and
   ``torch_file_tensors`` (``torch.load(mmap=True, weights_only=True)``). After each tensor is copied,
   the pages it touched are handed back (``drop_pages``), so the mapped file never counts as
   resident memory beyond the tensor being copied.
3. ``stream_into`` routes each file tensor to the rows of a destination parameter or persistent
   buffer (``Piece``: a family's key renames, fused q/k/v rows, selected ``lm_head`` rows), allocates
   each destination once in the target dtype and device, copies into it, and checks that every
   destination was filled from the file exactly once (one-line ``ValueError`` otherwise).
4. On the CPU a file tensor that already is its whole destination (same 16-bit dtype, same bytes
   in the destination's shape: no rows, no transform but a reshape) is not copied: the weight stays
   in the file's private mapping (``MAP_PRIVATE``: the model's own writes copy the page and never
   reach the file), its pages read in once at load (``populate``). The mapping does NOT isolate the
   model from the file: pages not yet copied are the file's pages, so a file rewritten in place
   changes the loaded weights, and a truncated one kills the process (SIGBUS) at the next forward
   that touches a missing page (llama.cpp's mapped weights share this hazard). ``check_mapped_files``
   (run before every pipeline call) compares each mapped file's size and mtime with those at load and
   stops in one line naming the file; replacing the file (a new inode: ``mv``, ``cp`` to a temporary
   then rename, a fresh download) is safe, the mapping keeps the old one. Do not rewrite a loaded
   checkpoint in place. Fresh anonymous memory is what a copy costs: on a 2-core VM, touching 2.85
   GiB of it took 2.2-6.2 s, mapping the same bytes from the page cache 0.05-0.07 s
   (docs/results/scale-cpu.md). Mapped pages count in the resident set (``RssFile``) like copied ones;
   ``models.weight_layout.available_memory_bytes`` does not count them as free.

``TRACE``: when a list, the sources append ``("open", path)``, ``("read", key)``, ``("drop", key)``
(its pages handed back), ``("keep", key)`` (left in the mapping as the weight itself) and
``("close", path)`` in reading order (tests observe shard-at-a-time loading through it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import mmap
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from ..checks import one_line
from ..io import read_text, regular_file

TRACE: list[tuple[str, str]] | None = None
"""Reading order of the sources (None: not recorded)."""


def _trace(event: str, what: str) -> None:
    if TRACE is not None:
        TRACE.append((event, what))


# ---------------------------------------------------------------- building without initialisation
INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                  "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def empty_parameters():
    """Inside: every parameter a module registers is replaced by a meta tensor of its shape (what
    ``accelerate.init_empty_weights(include_buffers=False)`` does), and ``torch.nn.init``'s functions
    return a meta tensor untouched (as transformers' ``no_init_weights`` does: an in-place random op
    on a meta tensor would run torch's Python reference kernels, whose first use imports
    ``torch._dynamo``, 6 s here). Buffers stay real. Not thread-safe (it patches
    ``nn.Module.register_parameter`` and ``torch.nn.init``)."""
    original = nn.Module.register_parameter
    inits = {name: getattr(nn.init, name) for name in INIT_FUNCTIONS}

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    def skipping(init):
        return lambda tensor, *a, **k: tensor if tensor.is_meta else init(tensor, *a, **k)

    nn.Module.register_parameter = register
    for name, init in inits.items():
        setattr(nn.init, name, skipping(init))
    try:
        yield
    finally:
        nn.Module.register_parameter = original
        for name, init in inits.items():
            setattr(nn.init, name, init)


def skeleton(factory: Callable[[], nn.Module]) -> nn.Module:
    """``factory()`` built inside ``empty_parameters``: parameters on the meta device."""
    with empty_parameters():
        return factory()


# ---------------------------------------------------------------- memory-mapped sources
def _libc_madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.madvise
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return fn
    except (OSError, AttributeError):
        return None


_MADVISE = _libc_madvise() if hasattr(mmap, "MADV_DONTNEED") else None
_PAGE = mmap.PAGESIZE
_LINUX = sys.platform.startswith("linux")  # the MADV_POPULATE_* numbers are Linux's
MADV_POPULATE_READ = 22
"""Linux 5.14's madvise advice that faults a range in (page tables filled from the page cache, the
file read where it is not cached) in one call; older kernels answer EINVAL."""


def _page_range(t: torch.Tensor) -> tuple[int, int]:
    """(first, length) of the pages that overlap ``t``'s bytes."""
    start = t.data_ptr() // _PAGE * _PAGE
    end = -(-(t.data_ptr() + t.numel() * t.element_size()) // _PAGE) * _PAGE
    return start, end - start


MADV_POPULATE_WRITE = 23
"""Linux 5.14's advice that faults a writable range in (fresh pages zeroed) in one call."""


def prefault(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a fresh CPU tensor of 1 MiB or more) with its pages faulted in by one
    ``MADV_POPULATE_WRITE`` call instead of one page fault a page during the copy: 1.27 against 1.49
    s (medians of 5) for a 1.5B load copying 0.6 GiB on a busy 2-core VM (docs/results/scale-cpu.md).
    Older kernels refuse the advice and the copy faults the pages as before."""
    if _MADVISE is not None and _LINUX and t.device.type == "cpu" and t.numel() * t.element_size() >= 1 << 20:
        _MADVISE(*_page_range(t), MADV_POPULATE_WRITE)
    return t


MAPPED_FILES: set[str] = set()
"""Files whose mapping holds weights of a loaded model (``stream_into`` kept a tensor of theirs)."""

MAPPED_STATS: dict[str, tuple[int, int, int, int]] = {}
"""Each mapped file's (device, inode, size, mtime in ns) when its weights were kept."""


def _signature(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _still_mapped(inode: int) -> bool:
    """Whether a mapping of this process is of the file with ``inode`` (/proc/self/maps' fifth field);
    True where the maps cannot be read."""
    try:
        with open("/proc/self/maps") as f:
            return any(len(parts) > 4 and parts[4] == str(inode) for parts in (line.split() for line in f))
    except OSError:
        return True


def check_mapped_files() -> None:
    """A one-line ValueError naming the first mapped weights file rewritten in place (same inode, size
    or mtime changed) since its weights were kept: the loaded model's weights are that file's pages
    (a truncated file would end the process with SIGBUS at the next forward). A file removed or
    replaced by another (new inode) leaves the mapping, and so the weights, as they were; a changed
    file no mapping holds any more (its model was freed) is forgotten. One ``os.stat`` a file (a few
    microseconds); /proc/self/maps is read only when a file changed."""
    for path, (dev, ino, size, mtime) in list(MAPPED_STATS.items()):
        try:
            now = _signature(path)
        except OSError:
            continue  # removed: the mapping keeps the old inode alive
        if now[:2] != (dev, ino) or now[2:] == (size, mtime):
            continue
        if not _still_mapped(ino):  # the model that mapped it is gone: nothing holds its pages now
            del MAPPED_STATS[path]
            MAPPED_FILES.discard(path)
            continue
        if now[2] != size:
            raise ValueError(f"weights file {path} changed size on disk ({size} -> {now[2]} bytes) while its weights "
                             "are mapped into the loaded model: reload the model (replace checkpoints by a new file, "
                             "never in place)")
        if now[3] != mtime:
            raise ValueError(f"weights file {path} was rewritten on disk while its weights are mapped into the loaded "
                             "model, which may now hold other values: reload the model (replace checkpoints by a new "
                             "file, never in place)")


def mapped_weight_bytes() -> int:
    """Resident bytes of this process's mappings of ``MAPPED_FILES`` (``Rss`` in /proc/self/smaps): the
    page cache counts them as reclaimable (``MemAvailable``), but they are the loaded weights. 0
    where smaps cannot be read."""
    if not MAPPED_FILES:
        return 0
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    total = 0
    for path in MAPPED_FILES:  # each mapping of the file: its header line ends with the path, then "Rss: N kB"
        at = text.find(" " + path + "\n")
        while at >= 0:
            rss = text.find("\nRss:", at)
            if rss >= 0:
                total += int(text[rss + 5: text.find("kB", rss)]) * 1024
            at = text.find(" " + path + "\n", at + 1)
    return total


def populate(t: torch.Tensor) -> None:
    """Make a memory-mapped CPU tensor's pages resident now (``MADV_POPULATE_READ``; where the
    kernel has none, one read per page), so that a load ends with its weights in memory and the
    first forward does not pay for reading the file."""
    if t.numel() == 0:
        return
    start, length = _page_range(t)
    if _MADVISE is not None and _LINUX:
        _MADVISE(start, length, mmap.MADV_WILLNEED)  # readahead of the whole range, where not cached
        if _MADVISE(start, length, MADV_POPULATE_READ) == 0:
            return
    flat = t.reshape(-1).view(torch.uint8) if t.element_size() == 1 else t.reshape(-1)
    step = max(1, _PAGE // t.element_size())
    float(flat[::step].float().sum())  # touches one element per page


def drop_pages(t: torch.Tensor) -> bool:
    """Hand back the whole pages inside a memory-mapped CPU tensor's bytes (``madvise(MADV_DONTNEED)``).
    Only for tensors whose data lies in a read-only file mapping that nothing else writes: the pages
    leave this process's resident set and, if read again, fault back in from the page cache with the
    same bytes. Returns whether anything was dropped (False where madvise is unavailable)."""
    if _MADVISE is None or t.device.type != "cpu" or t.numel() == 0:
        return False
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    a, b = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    return b > a and _MADVISE(a, b - a, mmap.MADV_DONTNEED) == 0


def safetensors_keys(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{key: (dtype name, shape)} from a safetensors file's header (the only bytes read)."""
    regular_file(path, "checkpoint file")
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n < 100_000_000:
                raise ValueError(f"header length {n}")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable safetensors ({one_line(exc)})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: unreadable safetensors (header is not a JSON object)")
    check_header(path, header, os.stat(path).st_size - 8 - n)
    return {k: (v.get("dtype", "?"), tuple(v.get("shape", ()))) for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict)}


ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
              "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def check_header(path: str | os.PathLike, header: dict, data_bytes: int) -> None:
    """A safetensors header consistent with its file: every tensor's ``data_offsets`` [begin, end)
    inside the ``data_bytes`` after the header, and end - begin its shape's elements times its dtype's
    size. A one-line ValueError naming the first tensor that is not (a header that claims more bytes
    than the file has would otherwise pass as a checkpoint of other sizes, or fault at a read)."""
    for key, v in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in v["data_offsets"])
            shape = [int(d) for d in v["shape"]]
            item = ITEM_BYTES.get(v["dtype"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: safetensors header entry {key!r} lacks dtype, shape or data_offsets") from None
        numel = 1
        for d in shape:
            numel *= d
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_bytes or (item and end - begin != numel * item):
            raise ValueError(f"{path}: the safetensors header is inconsistent with the file's size: tensor {key!r} "
                             f"claims bytes {begin}..{end} ({'x'.join(map(str, shape)) or 'scalar'} {v['dtype']}) of "
                             f"the {data_bytes} data bytes the file has")


def safetensors_tensors(files: Sequence[Path], wanted: Callable[[str], bool] = lambda k: True,
                        kept: Callable[[str], bool] = lambda k: False) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, memory-mapped tensor) for the ``wanted`` keys of each file in order, one file open at a
    time; each tensor's pages are dropped once the consumer has taken it (resumed the iterator),
    unless the consumer ``kept`` it as a weight (the mapping outlives the closed file handle)."""
    from safetensors import safe_open

    for path in files:
        _trace("open", str(path))
        try:
            fh = safe_open(str(path), framework="pt")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{path}: unreadable safetensors ({one_line(exc)})") from None
        with fh:
            for key in fh.keys():
                if not wanted(key):
                    continue
                _trace("read", key)
                try:
                    t = fh.get_tensor(key)
                except Exception as exc:  # noqa: BLE001
                    raise ValueError(f"{path}: unreadable tensor {key!r} ({one_line(exc)})") from None
                yield key, t
                _hand_back(key, t, kept, path)
                del t
        _trace("close", str(path))


def read_torch_file(path: str | os.PathLike, allowed: Sequence[type] = ()):
    """``torch.load(path, mmap=True, weights_only=True)``, also unpickling the classes ``allowed``
    (LlamaGen's and MAR's training files carry an ``argparse.Namespace``): tensors stay in the file
    mapping until read. A file saved in torch's legacy (non-zip) format cannot be mapped and is read
    whole."""
    regular_file(path, "checkpoint file")
    with torch.serialization.safe_globals(list(allowed)):
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(str(path), map_location="cpu", weights_only=True)


def torch_file_tensors(sd: dict[str, torch.Tensor], where: str, kept: Callable[[str], bool] = lambda k: False
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, tensor) of a state dict read by ``read_torch_file``; each tensor's pages are dropped once
    taken, unless ``kept`` (tensors that share storage fault their pages back in from the file)."""
    _trace("open", where)
    for key, t in sd.items():
        _trace("read", key)
        yield key, t
        _hand_back(key, t, kept, where)
    _trace("close", where)


def _hand_back(key: str, t: torch.Tensor, kept: Callable[[str], bool], path: str | os.PathLike) -> None:
    """After the consumer took ``t`` (read from file ``path``): note that it was kept (its file joins
    ``MAPPED_FILES``), or drop its pages."""
    if kept(key):
        if os.path.isfile(path):
            real = os.path.realpath(path)
            MAPPED_FILES.add(real)
            MAPPED_STATS[real] = _signature(real)
        _trace("keep", key)
    elif drop_pages(t):
        _trace("drop", key)


# ---------------------------------------------------------------- routing and copying
@dataclass(frozen=True)
class Piece:
    """Where a file tensor goes: rows ``rows`` (a slice of dim 0; None: the whole tensor) of the
    model's parameter or persistent buffer ``name``, after ``transform`` (None: as stored). A
    transform may return a view whose leading dims split the rows (e.g. (heads, d/2, 2, in) for d
    rows a head): it is copied straight into the destination rows, with no temporary copy."""

    name: str
    rows: slice | None = None
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None


Route = Callable[[str], Sequence[Piece] | None]
"""A file key -> its pieces; ``()`` skips the key (not read), None makes it an unexpected tensor."""


def identity_route(rename: Callable[[str], str] = lambda k: k, skip: Callable[[str], bool] = lambda k: False) -> Route:
    """Each file key to the whole destination ``rename(key)``; ``skip`` keys are not read."""
    return lambda key: () if skip(key) else (Piece(rename(key)),)


def destinations(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint must fill: parameters and persistent buffers by their module paths
    (shared parameters once, under their first name)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, mod in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for name, p in mod._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out[dot + name] = p
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                out[dot + name] = b
    return out


def _flat_shape(value: torch.Tensor, dims: int) -> tuple[int, ...]:
    """``value``'s shape with its leading dims merged so that ``dims`` remain (as it is if it has fewer)."""
    lead = value.dim() - dims
    if lead <= 0:
        return tuple(value.shape)
    rows = 1
    for n in value.shape[:lead + 1]:
        rows *= n
    return (rows, *value.shape[lead + 1:])


def _rows_of(shape: torch.Size | tuple[int, ...]) -> int:
    return shape[0] if len(shape) else 1


def _span(piece: Piece, shape) -> range:
    n = _rows_of(shape)
    return range(n) if piece.rows is None else range(n)[piece.rows]


def _coverage(runs: list[tuple[int, int]], n: int) -> tuple[bool, bool]:
    """(some of rows 0..n-1 are in no run, some row is in two runs) for [start, stop) runs."""
    gap = overlap = False
    end = 0
    for start, stop in sorted(r for r in runs if r[1] > r[0]):
        gap |= start > end
        overlap |= start < end
        end = max(end, stop)
    return gap or end < n, overlap


def check_routes(keys: Iterable[str], route: Route, dests: dict[str, torch.Tensor], where: str,
                 display: Callable[[str], str] = lambda n: n) -> dict[str, list[Piece]]:
    """Route every file key before any data is read: an unexpected key or a destination the file
    does not fill (wholly, once) is a one-line ValueError (destinations named as ``display`` spells
    them: the file's own key names where a route renames). Returns {key: pieces} of the keys to read."""
    plan: dict[str, list[Piece]] = {}
    unexpected: list[str] = []
    spans: dict[str, list[tuple[int, int]]] = {name: [] for name in dests}  # [start, stop) row runs filled
    for key in keys:
        pieces = route(key)
        if pieces is None or any(p.name not in dests for p in pieces):
            unexpected.append(key)
            continue
        if pieces:
            plan[key] = list(pieces)
        for p in pieces:
            r = _span(p, dests[p.name].shape)
            spans[p.name] += [(r.start, r.stop)] if r.step == 1 else [(i, i + 1) for i in r]
    if unexpected:
        raise ValueError(f"{where}: checkpoint has {len(unexpected)} unexpected tensors, e.g. {unexpected[0]!r}")
    cover = {name: _coverage(spans[name], _rows_of(t.shape)) for name, t in dests.items()}
    missing = sorted(n for n, (gap, _) in cover.items() if gap)
    if missing:
        raise ValueError(f"{where}: checkpoint lacks {len(missing)} tensors, e.g. {display(missing[0])!r}")
    twice = sorted(n for n, (_, overlap) in cover.items() if overlap)
    if twice:
        raise ValueError(f"{where}: checkpoint fills {display(twice[0])!r} more than once")
    return plan


@dataclass
class Loaded:
    """What ``stream_into`` did: the file keys read, in order, and the bytes now held by the
    destinations it allocated."""

    keys: list[str]
    bytes: int


MAPPED_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes whose CPU weights stay in the file mapping when the file stores them so: fp32 linear
weights are re-laid out on the CPU (``models.weight_layout.transpose_linear_weights`` copies them),
which would leave the mapped pages resident beside the copy."""


def maps_in_place(piece: Piece, src: torch.Tensor, value: torch.Tensor, dest: torch.Tensor, dtype: torch.dtype,
                  device: torch.device) -> bool:
    """Whether file tensor ``src``, which its piece's transform made ``value`` (``src`` itself when
    there is none), can be destination ``dest`` itself, left in the file mapping: on the CPU, a whole
    destination (no rows) stored in the load dtype (a 16-bit one: ``MAPPED_DTYPES``) whose value is
    the file tensor's own bytes in order (no transform, or one that only reshapes: same first byte,
    same element count, contiguous), in the destination's shape."""
    return (device.type == "cpu" and src.device.type == "cpu" and piece.rows is None
            and dtype in MAPPED_DTYPES and dest.is_floating_point() and src.dtype == dtype
            and value.dtype == src.dtype and value.data_ptr() == src.data_ptr() and value.numel() == src.numel()
            and tuple(value.shape) == tuple(dest.shape) and value.is_contiguous())


def stream_into(model: nn.Module, keys: Iterable[str], tensors: Callable[..., Iterable[tuple[str, torch.Tensor]]],
                route: Route, dtype: torch.dtype, device: torch.device | str, where: str,
                finish: Callable[[str, torch.Tensor], bool] | None = None,
                display: Callable[[str], str] = lambda n: n) -> Loaded:
    """Fill ``model`` (built by ``skeleton``) from a checkpoint: ``keys`` are its file keys (read from
    headers or the index, no data), ``tensors(wanted)`` yields the ``wanted`` ones as (key, tensor).
    Each destination is allocated once, in ``dtype`` (floating point; others keep their own) on
    ``device``, and filled piece by piece; ``finish(name, tensor)``, when given, is called as each
    destination is complete and returns True when it took the tensor over (it is then neither kept
    nor installed: ``models.quantize.streaming_quantizer`` replaces the layer that owned it). Every parameter and persistent buffer must come from the file
    (``check_routes``); then non-persistent buffers follow to ``device`` and ``dtype`` as
    ``Module.to`` moves them. One-line ValueErrors for unexpected, missing or mis-shaped tensors.
    ``tensors(wanted, kept)``: ``kept(key)`` tells the source that the tensor it yielded is now a
    weight (``maps_in_place``: not copied, its pages made resident by ``populate`` and not dropped);
    never with a ``finish`` hook (a quantized load frees each float weight)."""
    device = torch.device(device)
    dests = destinations(model)
    plan = check_routes(keys, route, dests, where, display)
    remaining = {name: _rows_of(t.shape) for name, t in dests.items()}  # each row comes once (check_routes)
    made: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    order: list[str] = []
    kept: set[str] = set()
    for key, src in tensors(lambda k: k in plan, kept.__contains__):
        order.append(key)
        pieces = plan[key]
        for piece in pieces:
            meta = dests[piece.name]
            value = src if piece.transform is None else piece.transform(src)
            if meta.is_floating_point() and not value.is_floating_point():
                raise ValueError(f"{where}: {key!r} is stored as {str(value.dtype).removeprefix('torch.')}, but the "
                                 f"model's {display(piece.name)} is floating point (a damaged or mislabelled checkpoint)")
            if finish is None and len(pieces) == 1 and maps_in_place(piece, src, value, meta, dtype, device):
                populate(value)
                made[piece.name] = value
                kept.add(key)
                continue
            out = made.get(piece.name)
            if out is None:
                kind = dtype if meta.is_floating_point() else meta.dtype
                out = made[piece.name] = prefault(torch.empty(meta.shape, dtype=kind, device=device))
            view = out if piece.rows is None else out[piece.rows]
            if _flat_shape(value, view.dim()) != tuple(view.shape):
                shown = tuple(meta.shape) if piece.rows is None else f"rows {piece.rows.start}:{piece.rows.stop} {tuple(view.shape)}"
                raise ValueError(f"{where}: shape mismatch for {key!r}: file {tuple(src.shape)} vs model {piece.name} {shown}")
            with torch.no_grad():
                (view if value.dim() == view.dim() else view.view(value.shape)).copy_(value)
            del value
            remaining[piece.name] -= len(_span(piece, meta.shape))
            if remaining[piece.name] == 0 and finish is not None and finish(piece.name, out):
                consumed.add(piece.name)
                del made[piece.name], out  # the hook took it (e.g. quantized it): the float copy is freed
    _install(model, {k: v for k, v in dests.items() if k not in consumed}, made)
    model.to(device=device, dtype=dtype)  # non-persistent buffers (the parameters are already there)
    return Loaded(order, sum(t.numel() * t.element_size() for t in made.values()))


def _install(model: nn.Module, dests: dict[str, torch.Tensor], made: dict[str, torch.Tensor]) -> None:
    """Put the filled tensors in place of the meta ones, in every module that holds them."""
    by_id = {}
    for name, meta in dests.items():
        value = made[name]
        by_id[id(meta)] = nn.Parameter(value, requires_grad=meta.requires_grad) if isinstance(meta, nn.Parameter) else value
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for k, v in store.items():
                if v is not None and id(v) in by_id:
                    store[k] = by_id[id(v)]
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"parameter {left[0]!r} was not loaded")


# ---------------------------------------------------------------- checkpoint files
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def safetensors_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards its index names (in order), or model.safetensors."""
    index = directory / INDEX
    if index.exists():
        try:
            shards = sorted(set(json.loads(read_text(index, "checkpoint file")).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{index}: unreadable index ({one_line(exc)})") from None
        missing = [s for s in shards if not (directory / s).exists()]
        if not shards or missing:
            raise ValueError(f"{directory}: {INDEX} names missing shards {missing[:3] or '(none listed)'}")
        return [directory / s for s in shards]
    if (directory / SINGLE).exists():
        return [directory / SINGLE]
    raise ValueError(f"{directory}: no weights ({SINGLE} or {INDEX})")


def safetensors_index(files: Sequence[Path]) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """{key: (file, dtype name, shape)} over the files' headers."""
    out = {}
    for f in files:
        for key, (dt, shape) in safetensors_keys(f).items():
            out[key] = (f, dt, shape)
    return out


def load_safetensors(model: nn.Module, files: Sequence[Path], route: Route, dtype: torch.dtype,
                     device: torch.device | str, where: str, finish=None) -> Loaded:
    """``stream_into`` from safetensors files (only the shards holding wanted keys are opened)."""
    index = safetensors_index(files)
    plan_keys = list(index)

    def tensors(wanted, kept):
        needed = [f for f in files if any(wanted(k) for k, (g, _, _) in index.items() if g == f)]
        return safetensors_tensors(needed, wanted, kept)

    return stream_into(model, plan_keys, tensors, route, dtype, device, where, finish)


def load_state_dict_file(model: nn.Module, sd: dict[str, torch.Tensor], route: Route, dtype: torch.dtype,
                         device: torch.device | str, where: str, finish=None, display=lambda n: n) -> Loaded:
    """``stream_into`` from a state dict read by ``read_torch_file`` (memory-mapped)."""
    return stream_into(model, list(sd), lambda wanted, kept: torch_file_tensors({k: v for k, v in sd.items() if wanted(k)}, where, kept),
                       route, dtype, device, where, finish, display)


# ---------------------------------------------------------------- dtypes
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
CONFIG_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dominant_dtype(sizes: Iterable[tuple[torch.dtype, int]]) -> torch.dtype | None:
    """The floating dtype holding the most elements (fp32, bf16 or fp16), None if there is none."""
    count: dict[torch.dtype, int] = {}
    for dt, n in sizes:
        if dt in (torch.float32, torch.bfloat16, torch.float16):
            count[dt] = count.get(dt, 0) + n
    return max(count, key=count.get) if count else None


def config_dtype(config: dict | None) -> torch.dtype | None:
    """``torch_dtype`` (transformers 4) or ``dtype`` (5) of a config.json, or of its text_config."""
    for d in (config or {}, (config or {}).get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            if isinstance(d.get(key), str) and d[key] in CONFIG_DTYPES:
                return CONFIG_DTYPES[d[key]]
    return None


def safetensors_dtype(files: Sequence[Path]) -> torch.dtype | None:
    """The stored dtype of a safetensors checkpoint (the floating dtype of most of its elements)."""
    sizes = []
    for (dt, shape) in (v for f in files for v in safetensors_keys(f).values()):
        n = 1
        for s in shape:
            n *= int(s)
        sizes.append((SAFETENSORS_DTYPES.get(dt), n))
    return dominant_dtype(sizes)


def state_dict_dtype(sd: dict[str, torch.Tensor]) -> torch.dtype | None:
    return dominant_dtype((t.dtype, t.numel()) for t in sd.values())


def default_dtype(stored: torch.dtype | None, device: torch.device | str) -> tuple[torch.dtype, str]:
    """The dtype a checkpoint stored in ``stored`` runs in by default on ``device``, and why: its own
    on CUDA; on a CPU its own where the CPU has dot products in it (``cpu_features``), else fp32."""
    from ..cpu_features import NATIVE_FLAGS, native_dot_products

    name = lambda dt: {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dt]  # noqa: E731
    if stored is None:
        return torch.float32, "fp32: the checkpoint stores no floating tensors"
    if torch.device(device).type != "cpu" or stored == torch.float32:
        return stored, f"the checkpoint's own ({name(stored)})"
    native = native_dot_products(stored)
    if native:
        return stored, f"the checkpoint's own ({name(stored)}): this CPU has {name(stored)} dot products"
    flags = "/".join(sorted(NATIVE_FLAGS[stored]))
    told = "has none of the cpuinfo flags " + flags if native is False else "cannot tell its features"
    return torch.float32, f"fp32: the checkpoint is {name(stored)}, which this CPU would emulate ({told})"


DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16}


def requested_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A dtype argument (fp32, bf16, fp16, a torch dtype of those, or None: the default) as a torch dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype) and dtype in DTYPE_NAMES.values():
        return dtype
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {dtype!r}")
    return DTYPE_NAMES[dtype]


def resolve(dtype: str | torch.dtype | None, stored: torch.dtype | None, device) -> tuple[torch.dtype, str]:
    """(dtype to load in, why): the requested one, or ``default_dtype`` of the stored one."""
    asked = requested_dtype(dtype)
    if asked is not None:
        return asked, "requested"
    return default_dtype(stored, device)


def rename_with(renames: Sequence[tuple[str, str]]) -> Callable[[str], str]:
    """A key rename applying (regex, replacement) pairs in order."""
    compiled = [(re.compile(p), r) for p, r in renames]

    def rename(key: str) -> str:
        for pattern, repl in compiled:
            key = pattern.sub(repl, key)
        return key

    return rename
