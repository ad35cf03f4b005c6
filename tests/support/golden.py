"""Stored results the tests compare against (tests/golden/): which CPU wrote them, and whether a run
asked to write them again (QEEBM_WRITE_GOLDEN)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def cpu_fingerprint() -> str:
    """What decides float rounding here: the vector width torch dispatches to and the CPU model."""
    info = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    model = "/".join(info.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping"))
    return f"{torch.backends.cpu.get_cpu_capability()} {model}"


def names_to_write(every: tuple[str, ...]) -> tuple[str, ...]:
    """QEEBM_WRITE_GOLDEN: "1" rewrites every entry of ``every``, a comma-separated list only those named."""
    value = os.environ.get("QEEBM_WRITE_GOLDEN", "")
    if not value:
        return ()
    return every if value == "1" else tuple(n.strip() for n in value.split(",") if n.strip() in every)
