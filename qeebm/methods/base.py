"""What the loop hands a training method, and what it gets back.

A method is any object with ``rollout`` and ``loss``; the loop never looks inside it. It is built as
``METHODS[name](cfg, translator, model)``: ``model`` is the accelerate-prepared module (possibly
DDP-wrapped) to call for forward passes that need gradients, ``translator.model`` the unwrapped one
for generation and scoring without gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass
class Batch:
    """One micro-batch on one process.

    ``src`` / ``tgt``: the B raw sentences (``tgt`` is None for source-only data).
    ``input_ids``, ``attention_mask``: [B, S] source tokens with the source language code.
    ``labels``: [B, T] target tokens, padding = -100, or None without targets.
    ``global_tokens``: label tokens in the whole optimiser step (all processes, all micro-steps).
    ``global_examples``: examples in the whole optimiser step (``optim.batch_size``).

    Dividing a sum over this micro-batch by a ``global_*`` count gives its contribution to the mean
    over the step, which is what ``Method.loss`` returns (docs/design.md).
    """

    src: list[str]
    tgt: list[str] | None
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor | None
    global_tokens: int
    global_examples: int


@dataclass
class StepOutput:
    """``loss``: this micro-batch's contribution to the step's objective (a scalar with a graph).
    ``metrics``: contributions too, keyed ``<method>/<name>``; the loop sums them over micro-steps
    and processes."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class Method(Protocol):
    def rollout(self, batch: Batch) -> Any:
        """Everything that needs no gradient: sampling, scoring, old log-probs."""
        ...

    def loss(self, rollout: Any) -> StepOutput:
        """The differentiable part, from what ``rollout`` returned."""
        ...
