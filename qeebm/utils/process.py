"""What qeebm's own programs set up for their process: the ``qeebm`` command, the recipe runner and
the scripts call ``setup_process()`` first thing. Importing qeebm as a library changes nothing in
the importing program's environment or warning filters.

- Huge pages: PyTorch's CPU allocator backs every allocation of 2 MiB or more with transparent huge
  pages when ``THP_MEM_ALLOC_ENABLE=1``. A training step allocates tensors of tens of MB afresh (the
  translator's logits, their gradients), and glibc hands blocks over 32 MiB back to the kernel when
  they are freed, so each new one faulted in 4 KiB at a time: most of a tiny-world QE-EBM step's
  backward was that (docs/performance.md). Torch reads the variable at its first tensor allocation,
  so it is set before any; a user who exports ``THP_MEM_ALLOC_ENABLE=0`` keeps it off.
- Third-party deprecation noise: warnings a user can do nothing about (a pinned dependency's use of
  a deprecated API) are ignored.

Both reach the worker processes a program starts (the demo's, the tiny world's) through the
environment: the warning filters as ``PYTHONWARNINGS`` entries, placed before a user's own entries,
which therefore take precedence.
"""

from __future__ import annotations

import os
import warnings

# (message prefix, category) of each ignored warning.
THIRD_PARTY_NOISE = (
    # torchmetrics 0.10 (unbabel-comet 2.2.7 pins it) imports pkg_resources, which setuptools 80
    # deprecates on import; setuptools<81 is pinned so that it still imports at all.
    ("pkg_resources is deprecated as an API", UserWarning),
)


def setup_process() -> None:
    """Huge-page allocations for torch and the third-party noise filters, for this process and the
    processes it starts (module docstring). Call it before anything allocates a tensor."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    for message, category in THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    # The -W / PYTHONWARNINGS form, action:message:category, matches the message as a literal prefix.
    ours = [f"ignore:{message}:{category.__name__}" for message, category in THIRD_PARTY_NOISE]
    theirs = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    os.environ["PYTHONWARNINGS"] = ",".join([o for o in ours if o not in theirs] + theirs)
