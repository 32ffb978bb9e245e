"""CPU layouts of linear weights: the kernel each call of ``nn.Linear`` runs fastest with.

``F.linear`` on the CPU sends float32 to MKL's sgemm and bf16 to oneDNN, which re-lays out the
weight on every call. Two layouts serve a decode's small calls better (same values; outputs differ
at rounding level only, as any two matmul kernels do):

- ``transpose_linear_weights``: W stored as the transpose of a contiguous (in, out) matrix (strides
  (1, out)), so that MKL's x W^T is a plain row-major product: 1.05-1.12x on the small-row calls of a
  decode where weights stream at L3 speed, 1.3-1.7x where memory was slow
  (docs/results/archive/weight-layout-cpu*.md).
- ``PackedLinear``: oneDNN over a copy of W packed once in its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``) for float32 calls of ``PACKED_MIN_ROWS`` rows or
  more and every bf16 call. MKL runs AVX2-class kernels on this repository's AMD EPYC (Zen 5, AVX-512)
  and oneDNN AVX-512 ones: one thread, 256 -> 768 products over 24 distinct weights took 162 against
  85 us at 34 rows (a 17-token verify with CFG), 962 against 428 at 272 (17 tokens at batch 8), and
  bf16 44 against 57-61 at 34 rows, 20 against 32-38 at one or two (docs/results/archive/cpu-linear.md).
"""
from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PACKED_MIN_ROWS", "PackedLinear", "available_memory_bytes", "prepare_cpu_linears",
           "transpose_linear_weights"]

# the fewest rows (product of the input's leading dims) a call needs to run packed oneDNN, by dtype.
# fp32 under 4 rows stays on MKL: packing from 2 rows made the emoji decodes slower at batch 1 (AR 0.507
# against 0.463 s an image, Speculative gamma 4 and the chain tree 3-4%; 8 alternating images each)
PACKED_MIN_ROWS = {torch.float32: 4, torch.bfloat16: 1}


def _packed_kernel_works() -> bool:
    """Whether this torch build runs oneDNN's packed linear (x86 builds with MKLDNN do)."""
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8), None)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(4, 8), w, None, "none", [], "")
        return bool(torch.all(y == 8))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


PACKED_AVAILABLE = torch.backends.mkldnn.is_available() and _packed_kernel_works()


class PackedLinear(nn.Linear):
    """``nn.Linear`` whose CPU inference calls (no autograd, not compiling) of at least
    ``PACKED_MIN_ROWS[dtype]`` rows run oneDNN over a packed copy of the weight; every other call is
    ``F.linear``. The copy is rebuilt whenever the weight has new storage, dtype or an in-place
    update (its version counter), so training and casts stay correct. Parameters and state dict are
    ``nn.Linear``'s."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple | None = None

    @property
    def is_packed(self) -> bool:
        """Whether the packed copy has been made (a packed call ran since the last pickling)."""
        return self._packed_key is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = PACKED_MIN_ROWS.get(w.dtype)
        if (rows is None or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != w.dtype
                or x.numel() < rows * x.shape[-1] or torch.compiler.is_compiling()):
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version, w.dtype)
        if self._packed_key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            self._packed_key = key
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        """Pickling and ``copy.deepcopy`` leave the packed copy out (oneDNN's opaque tensor has no
        storage to copy); the next packed call rebuilds it."""
        state = super().__getstate__()
        return {k: v for k, v in state.items() if k not in ("_packed", "_packed_key")}


def transpose_linear_weights(module: nn.Module) -> int:
    """Store every float32 CPU ``nn.Linear`` weight of ``module`` as the transpose of a contiguous
    (in, out) matrix (same values and shape, strides (1, out)); returns how many were changed. A
    weight shared with another module (an output head tied to the token embedding) is left as it
    is: embedding lookups read rows, which the transposed layout would scatter. bf16 and fp16
    weights stay (out, in): oneDNN's F.linear runs slower on the transposed layout
    (docs/results/archive/cpu-linear.md: 37.8 against 32.2 us at one row; at a 7B layer's shape, 11008 x
    4096, 11.7 against 7.2 ms at two rows: docs/results/data/cpu-linear-7b.json)."""
    owners: dict[int, int] = {}
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    changed = 0
    for sub in module.modules():
        w = getattr(sub, "weight", None)
        if (isinstance(sub, nn.Linear) and w is not None and w.device.type == "cpu" and owners[id(w)] == 1
                and w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous() and min(w.shape) > 1):
            w.data = w.data.t().contiguous().t()
            changed += 1
    return changed


def available_memory_bytes() -> int | None:
    """Memory this process can still allocate without swapping or being killed: the least of the
    machine's ``MemAvailable`` (/proc/meminfo; free pages where there is none) less the weights this
    process keeps in file mappings (``models.loading.mapped_weight_bytes``: MemAvailable counts them
    as reclaimable page cache), its cgroup's memory limit less the cgroup's usage
    (``cgroup_headroom_bytes``), and ``RLIMIT_AS`` less the address space in use; None where none
    is known."""
    from .loading import mapped_weight_bytes

    known = [cgroup_headroom_bytes(), address_space_headroom_bytes()]
    machine = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    machine = max(0, int(line.split()[1]) * 1024 - mapped_weight_bytes())
                    break
    except OSError:
        pass
    if machine is None:
        try:
            machine = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            machine = None
    known = [b for b in (machine, *known) if b is not None]
    return min(known) if known else None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def cgroup_headroom_bytes(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup less what the cgroup uses, or None where there is no
    limit: cgroup v2 (``memory.max``, ``memory.current`` of the path after ``0::`` in /proc/self/cgroup,
    and of its parents), else v1 (``memory/memory.limit_in_bytes``, ``memory.usage_in_bytes``; a limit
    of 2**60 or more is v1's "none")."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the limit of the process's cgroup and of each parent
            parts = [p for p in path.split("/") if p]
            for k in range(len(parts), -1, -1):
                d = os.path.join(root, *parts[:k])
                limit, used = _read_int(os.path.join(d, "memory.max")), _read_int(os.path.join(d, "memory.current"))
                if limit is not None and used is not None:
                    out = max(0, limit - used) if out is None else min(out, max(0, limit - used))
        elif "memory" in controllers.split(","):
            for d in (os.path.join(root, "memory", path.lstrip("/")), os.path.join(root, "memory")):
                limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
                used = _read_int(os.path.join(d, "memory.usage_in_bytes"))
                if limit is not None and used is not None and limit < 2**60:
                    out = max(0, limit - used) if out is None else min(out, max(0, limit - used))
                    break
    return out


def address_space_headroom_bytes() -> int | None:
    """``RLIMIT_AS`` less this process's address space in use (``VmSize``), or None where unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except OSError:
        pass
    return None


def prepare_cpu_linears(*modules: nn.Module, budget_bytes: int | None = None) -> int:
    """Both layouts for every CPU ``nn.Linear`` of ``modules``: weights transposed
    (``transpose_linear_weights``) and the layers made ``PackedLinear`` in place (their class only:
    the same objects, parameters and state dict, so modules shared with another model stay shared).

    A packed layer holds a second copy of its weight, so layers are packed in order (the first
    module's first) only while their weights together fit ``budget_bytes``, by default half the
    memory available now (``available_memory_bytes``): a 7B checkpoint in bf16 (14 GB) would not fit
    twice on a 24 GiB machine. The rest stay ``nn.Linear``, with a warning. Returns how many layers
    became ``PackedLinear`` (0 where this torch has no packed oneDNN kernel)."""
    linears = {}  # by identity: a layer shared by two modules is packed (and budgeted) once
    for module in modules:
        transpose_linear_weights(module)
        linears.update((id(s), s) for s in module.modules() if type(s) is nn.Linear and s.weight.device.type == "cpu")
    if not PACKED_AVAILABLE:
        return 0
    if budget_bytes is None:
        free = available_memory_bytes()
        budget_bytes = free // 2 if free is not None else None
    used = 0
    packed = 0
    for sub in linears.values():
        size = sub.weight.numel() * sub.weight.element_size()
        if budget_bytes is not None and used + size > budget_bytes:
            continue
        sub.__class__ = PackedLinear
        used += size
        packed += 1
    if packed < len(linears):
        warnings.warn(f"packed {packed} of {len(linears)} CPU linear layers: packed copies of the rest would pass "
                      f"the budget of {budget_bytes / 2**30:.2f} GiB (half the available memory); they run F.linear",
                      stacklevel=2)
    return packed
