"""Preemption: a signal asks the run to stop at the next micro-step.

Clusters warn a job before they kill it: SLURM sends SIGTERM (or, with ``--signal``, SIGUSR1 some
time ahead), Kubernetes SIGTERM and a grace period, and a launcher that is signalled itself gives
its workers a few seconds (accelerate's single-process launcher 5 s, torchrun 30 s). That grace has
to cover what the run does before it stops and the checkpoint, so the loop asks at every
micro-step, not only after the optimiser step: a step left before its first update (``loop.train_step``) changed no
weight, optimiser or schedule, and the loop puts back what it did change (the generators, the
method's own state) and writes the previous step's checkpoint; the resumed run redoes the step. A
method whose state could only be put back by copying a model every step (QE-dynamic's QE and its
optimiser: ``Method.step_snapshot``) finishes the step instead, and so does a step that already
applied an update (PPO's and GRPO's later epochs). Every process must stop at the same micro-step:
the signal may reach them at different moments, so they agree at each place where the loop asks.
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
        self._said = False
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        # A flag and nothing else: the handler can run inside a write blocked on a full pipe (a busy
        # launcher's stderr), and logging from it would enter that stream's write again and raise.
        if self.received is None:
            self.received = signal.Signals(signum).name

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
        if accelerator.num_processes == 1:
            # Asked at every micro-step: a device tensor read back would wait for the queued work.
            stop = self.received is not None
        else:
            flag = accelerator.reduce(torch.tensor([1.0 if self.received else 0.0], device=accelerator.device), "sum")
            stop = flag.item() > 0
            if stop and self.received is None:
                self.received = "a signal to another process"
        if stop and not self._said:
            self._said = True
            log.warning("received %s: stopping here with a checkpoint", self.received)
        return stop
