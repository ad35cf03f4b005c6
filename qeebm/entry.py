"""What qeebm's own programs set up for their process: the ``qeebm`` command, the recipe runner and
the scripts call ``setup_process()`` first thing. Importing qeebm as a library changes nothing in
the importing program's environment.

Huge pages: PyTorch's CPU allocator backs every allocation of 2 MiB or more with transparent huge
pages when ``THP_MEM_ALLOC_ENABLE=1``. A training step allocates tensors of tens of MB afresh (the
translator's logits, their gradients), and glibc hands blocks over 32 MiB back to the kernel when
they are freed, so each new one faulted in 4 KiB at a time: most of a tiny-world QE-EBM step's
backward was that (docs/performance.md). Torch reads the variable at its first tensor allocation, so
it is set before any, and the worker processes a program starts (the demo's, the tiny world's)
inherit it; a user who exports ``THP_MEM_ALLOC_ENABLE=0`` keeps it off.
"""

from __future__ import annotations

import os


def setup_process() -> None:
    """Huge-page allocations for torch in this process and the processes it starts (module
    docstring). Call it before anything allocates a tensor."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
