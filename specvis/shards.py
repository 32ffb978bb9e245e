"""How work is split, for ``specvis bench --shards`` and ``specvis sample`` under torchrun: one way.

The work list is fixed by (num, batch size, conditions, seed) alone: image i has condition
i % n_conditions, batch j holds images j*batch_size .. and is generated with seed + j. A shard (a
bench shard, a torchrun rank) takes the batches j with j % shards == index. So which images a
batch holds, and the seed it runs with, never depend on how many shards there are.
"""

from __future__ import annotations

__all__ = ["Work", "batches", "shard_work"]

Work = list[tuple[list[int], int]]


def batches(num: int, batch_size: int, num_conditions: int, seed: int, keyed: bool = False) -> Work:
    """Deterministic work list: image i has condition i % num_conditions; batch j uses seed + j, or under
    keyed noise (``keyed``) seed + j * batch_size, so that image i has seed + i (image k of a call: its seed + k)."""
    out = []
    for j, start in enumerate(range(0, num, batch_size)):
        out.append(([i % num_conditions for i in range(start, min(start + batch_size, num))],
                    seed + (start if keyed else j)))
    return out


def shard_work(work: Work, shards: int = 1, shard_index: int = 0, *,
               allow_empty: bool = False) -> tuple[list[int], Work]:
    """(batch indices, batches) of one shard: batches j with j % shards == shard_index. An empty
    shard is an error unless ``allow_empty`` (a torchrun rank with more ranks than batches idles)."""
    if shards < 1 or not 0 <= shard_index < shards:
        raise ValueError(f"--shard-index must be in 0..{shards - 1} and --shards >= 1, got {shard_index} of {shards}")
    idx = list(range(shard_index, len(work), shards))
    if not idx and not allow_empty:
        raise ValueError(f"shard {shard_index} of {shards} has no batches ({len(work)} batches in all)")
    return idx, [work[j] for j in idx]
