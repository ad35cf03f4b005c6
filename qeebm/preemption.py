"""Preemption: a signal asks the run to stop at the end of the current step.

Clusters warn a job before they kill it: SLURM sends SIGTERM (or, with ``--signal``, SIGUSR1 some
time ahead), Kubernetes SIGTERM and a grace period. Inside a training step the only safe place to
stop is after the optimiser step, and every process must stop after the same one: the signal may
reach them at different moments, so they agree once per step on whether any of them got one.
The loop then writes a checkpoint and returns; the same command resumes from it.
"""

from __future__ import annotations

import logging
import signal
import threading

import torch

from qeebm.errors import QeebmError

log = logging.getLogger(__name__)


def parse_signals(names: list[str]) -> list[signal.Signals]:
    out = []
    for name in names:
        try:
            out.append(signal.Signals[name.upper()])
        except KeyError:
            raise QeebmError(f"output.preempt_signals: unknown signal {name!r} (e.g. SIGTERM, SIGUSR1)") from None
    return out


class Preemption:
    """Context manager that catches ``names`` while it is active (then restores the old handlers)."""

    def __init__(self, names: list[str]):
        self.signals = parse_signals(names)
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            log.warning("received %s: stopping after the current step", self.received)

    def __enter__(self) -> "Preemption":
        # Handlers can only be installed from the main thread (a run started from a worker thread
        # keeps the default actions).
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def requested(self, accelerator) -> bool:
        """Whether any process received a signal (collective: every process must call it)."""
        flag = torch.tensor([1.0 if self.received else 0.0], device=accelerator.device)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(flag, "sum")
        if flag.item() > 0 and self.received is None:
            self.received = "a signal to another process"
        return flag.item() > 0
