"""qeebm."""
import os as _os

# PyTorch's CPU allocator backs every allocation of 2 MiB or more with transparent huge pages when
# THP_MEM_ALLOC_ENABLE=1. A training step allocates tensors of tens of MB afresh (the translator's
# logits, their gradients), and glibc hands blocks over 32 MiB back to the kernel when they are freed,
# so each new one faults in 4 KiB at a time: most of a tiny-world QE-EBM step's backward was that
# (docs/performance.md). Torch reads the variable once, at the first tensor allocation, so it is set
# here, before this package imports torch; a user who exports THP_MEM_ALLOC_ENABLE=0 keeps it off.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
