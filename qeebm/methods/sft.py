"""Supervised fine-tuning: label-smoothed cross-entropy on the reference translations."""

from __future__ import annotations

import torch

from qeebm.config import Config
from qeebm.errors import QeebmError
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import label_smoothed_ce


class SFT(Method):
    name = "sft"
    trained_on_qe = False

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.model = model
        self.label_smoothing = cfg.optim.label_smoothing

    def rollout(self, batch: Batch) -> Batch:
        # Nothing to sample: the references are the targets.
        if batch.labels is None:
            raise QeebmError("method 'sft' needs target sentences; the training corpus has none")
        return batch

    def loss(self, batch: Batch) -> StepOutput:
        loss, nll = label_smoothed_ce(self.model, batch, self.label_smoothing, with_nll=True)
        return StepOutput(loss=loss, metrics={"sft/loss": loss.item(), "sft/nll": nll.item()})

