"""Supervised fine-tuning: label-smoothed cross-entropy on the reference translations."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qeebm.config import Config
from qeebm.errors import QeebmError
from qeebm.methods.base import Batch, Method, StepOutput


class SFT(Method):
    name = "sft"

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


def label_smoothed_ce(model: torch.nn.Module, batch: Batch, label_smoothing: float, upcast=torch.Tensor.float,
                      with_nll: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The labelled batch's label-smoothed cross-entropy, this micro-batch's contribution to the step's
    per-token mean, and (``with_nll``) the plain NLL the same way, without gradient (else None).
    ``upcast`` maps the logits to the dtype the loss is computed in."""
    # Explicit decoder inputs (Translator.decoder_inputs): mBART's shift from labels alone goes wrong
    # on a target holding a literal <pad>.
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   decoder_input_ids=batch.decoder_input_ids).logits
    logits = upcast(logits).flatten(0, 1)
    labels = batch.labels.flatten()
    # Sum, then divide by the step's token count: micro-batches and processes then add up
    # to the full-batch per-token mean whatever the split.
    total = max(batch.global_tokens, 1)
    loss = F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=label_smoothing, reduction="sum") / total
    if not with_nll:
        return loss, None
    with torch.no_grad():
        nll = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / total
    return loss, nll
