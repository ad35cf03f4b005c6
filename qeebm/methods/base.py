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
    ``decoder_input_ids``: [B, T] their teacher-forcing inputs (``Translator.decoder_inputs``).
    ``global_tokens``: label tokens in the whole optimiser step (all processes, all micro-steps).
    ``global_examples``: examples in the whole optimiser step (``optim.batch_size``).
    ``step``: the optimiser step this micro-batch belongs to, counted from 1 (for schedules).
    ``mono``: this micro-batch's slice of the source-only pool (``data.mono``), drawn by its own step
    sampler, or None; filled only for a method whose class sets ``needs_mono = True``.
    ``global_mono``: source-only sentences in the whole optimiser step (0 without a pool).

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
    step: int = 0
    mono: list[str] | None = None
    global_mono: int = 0
    decoder_input_ids: torch.Tensor | None = None


@dataclass
class StepOutput:
    """``loss``: this micro-batch's contribution to the step's objective (a scalar with a graph).
    ``metrics``: contributions too, keyed ``<method>/<name>``; the loop sums them over micro-steps
    and processes.
    ``terms``: the weighted parts of ``loss`` (they sum to it), by name, e.g.
    ``{"ce": alpha * ce, "energy": beta * e}``. The loop's gradient diagnostics compare their
    gradients (norms, ratio and cosine against ``"ce"``); empty for a single-term loss."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


class Method(Protocol):
    """The two calls every method has. Optional, looked up by the loop with ``getattr``:

    * ``needs_mono = True`` (class attribute): the loop reads ``data.mono`` and fills ``Batch.mono``;
    * ``check_config(cfg)`` (classmethod): method-specific checks before any model is loaded;
    * ``before_step(batches, all_reduce) -> dict[str, float]``: work done once per optimiser step,
      before its micro-steps, on this process's micro-batches of the step (QE-dynamic's QE update).
      ``all_reduce(tensor)`` sums a tensor over processes. Returns metric contributions;
    * ``state_dict()`` / ``load_state_dict(state)``: state the method owns (a QE and its optimiser,
      a running-mean baseline, a KL controller, a value head), saved in every checkpoint and
      restored on resume;
    * ``extra_parameters() -> list[Parameter]``: trainable parameters of the method's own (PPO's
      value head), put in the loop's one optimiser, clipped with the model's and averaged over
      processes like DDP does for the model;
    * ``finish_rollouts(rollouts, gather) -> rollouts``: called once all micro-steps' rollouts of
      the step exist, for what needs the whole step (baselines, whitening, KL control).
      ``gather(tensor)`` concatenates a 1-d tensor over processes;
    * ``epochs``, ``minibatches`` (ints, default 1) and ``minibatch(rollout, epoch, index)``: the loop
      makes one optimiser update per (epoch, minibatch), calling ``loss`` on
      ``minibatch(rollout, epoch, index)`` of every micro-step's rollout (PPO).
    """

    def rollout(self, batch: Batch) -> Any:
        """Everything that needs no gradient: sampling, scoring, old log-probs."""
        ...

    def loss(self, rollout: Any) -> StepOutput:
        """The differentiable part, from what ``rollout`` returned."""
        ...
