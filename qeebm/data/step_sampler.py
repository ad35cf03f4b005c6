"""Which training examples each optimiser step, process and micro-step sees.

The loop's determinism rests on this one class: exact resume and DDP parity both follow from the
order being a pure function of the step number.
"""

from __future__ import annotations

import hashlib

import torch


class StepSampler:
    """Deterministic infinite stream of example indices: epoch e is a permutation drawn from a
    torch.Generator seeded with (seed, e), and step s covers stream positions
    [s*global_batch, (s+1)*global_batch). A pure function of (n, global_batch, seed, step), so
    resuming at step k replays exactly what an uninterrupted run would have seen, and any split of
    a step over processes and micro-steps sees the same examples. (A few recent permutations are
    cached; that is speed only, never state.)"""

    _CACHE = 4

    def __init__(self, n: int, global_batch: int, seed: int):
        if n <= 0:
            raise ValueError(f"cannot sample from an empty corpus (n={n})")
        if global_batch <= 0:
            raise ValueError(f"global_batch must be positive; got {global_batch}")
        self.n = n
        self.global_batch = global_batch
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def _epoch_seed(self, epoch: int) -> int:
        # Hashing keeps (seed, e) and (seed', e') from colliding the way seed + e would.
        digest = hashlib.sha256(f"qeebm.StepSampler:{self.seed}:{epoch}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)

    def permutation(self, epoch: int) -> list[int]:
        perm = self._perms.get(epoch)
        if perm is None:
            gen = torch.Generator()
            gen.manual_seed(self._epoch_seed(epoch))
            perm = torch.randperm(self.n, generator=gen).tolist()
            if len(self._perms) >= self._CACHE:
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = perm
        return perm

    def global_indices(self, step: int) -> list[int]:
        if step < 0:
            raise ValueError(f"step must be >= 0; got {step}")
        pos = step * self.global_batch
        end = pos + self.global_batch
        out: list[int] = []
        while pos < end:
            epoch, offset = divmod(pos, self.n)
            take = min(end - pos, self.n - offset)
            out.extend(self.permutation(epoch)[offset : offset + take])
            pos += take
        return out

    def local_indices(self, step: int, micro: int, rank: int, world: int, accum: int) -> list[int]:
        """Slice ``micro * world + rank`` of the step's global list cut into ``accum * world``
        equal contiguous slices."""
        parts = world * accum
        if world <= 0 or accum <= 0:
            raise ValueError(f"world and accum must be positive; got world={world}, accum={accum}")
        if self.global_batch % parts != 0:
            raise ValueError(
                f"global batch {self.global_batch} does not split into {world} processes x {accum} "
                f"accumulation steps; make it a multiple of {parts}"
            )
        if not (0 <= micro < accum and 0 <= rank < world):
            raise ValueError(f"micro={micro}, rank={rank} out of range for accum={accum}, world={world}")
        size = self.global_batch // parts
        k = micro * world + rank
        return self.global_indices(step)[k * size : (k + 1) * size]

    def epoch_of(self, step: int) -> float:
        """Epochs completed before ``step`` starts (fractional)."""
        return step * self.global_batch / self.n
