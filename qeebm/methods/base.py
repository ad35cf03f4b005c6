"""What the loop hands a training method (``Batch``), what it gets back (``StepOutput``), and the
contract between them (``Method``): every hook has a default, and the loop calls them all.
"""

from __future__ import annotations

import copy
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
    sampler, or None; filled only for a method whose ``needs_mono`` is true.
    ``global_mono``: source-only sentences in the whole optimiser step (0 without a pool).
    ``mono_ref``: the references of ``mono`` (a pool with a reference column), filled only for a
    method whose ``needs_reference`` is true: what a reference-based energy or reward reads.

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
    mono_ref: list[str] | None = None


@dataclass
class StepOutput:
    """``loss``: this micro-batch's contribution to the step's objective (a scalar with a graph).
    ``metrics``: contributions too, keyed ``<method>/<name>``; the loop sums them over micro-steps
    and processes (and averages over a step's updates).
    ``values``: the step's own numbers, the same on every micro-step and process (a schedule's alpha
    and beta, a KL coefficient, statistics the method computed over the whole step); logged as they
    are, from the step's first micro-batch.
    ``terms``: the weighted parts of ``loss`` (they sum to it), by name, e.g.
    ``{"ce": alpha * ce, "energy": beta * e}``. The loop's gradient diagnostics compare their
    gradients (norms, ratio and cosine against ``"ce"``); empty for a single-term loss.
    ``gradient_stats``: those diagnostics, when the method measured the terms' gradients on this
    micro-batch anyway (``diagnostics.gradient_stats``); the loop logs them instead of taking every
    term's gradient again."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    gradient_stats: dict[str, float] | None = None


class Method(Protocol):
    """What the loop calls, in this order, for every optimiser step; a method subclasses this and
    overrides what it needs (``rollout`` and ``loss`` always). Every default here does nothing (but
    ``step_snapshot``, which copies the state), so the loop calls every hook unconditionally and a
    misspelled override is the only way to skip one.

    Built as ``METHODS[cfg.method](cfg, translator, model)`` after ``check_config`` passed:
    ``model`` calls the accelerate-prepared module (possibly DDP- or DeepSpeed-wrapped), for forward
    passes that need gradients; ``translator.model`` is the unwrapped one, for generation and scoring
    without gradients. A method never touches the optimiser, scheduler, logger or accelerator.
    """

    name: str = "?"
    #: its settings' section in the config (``Config.<section>``), or None
    section: str | None = None
    #: its reward or energy is the QE of ``qe.path`` (or ``reward.terms``): the report records it as
    #: the training QE, and compare flags a gain on it alone as possible reward hacking
    trained_on_qe: bool = True
    #: the loop reads ``data.mono`` and fills ``Batch.mono`` / ``Batch.global_mono``
    needs_mono: bool = False
    #: the loop also reads the pool's references and fills ``Batch.mono_ref`` (set by a method whose
    #: energy or reward is reference-based, once it has loaded it)
    needs_reference: bool = False
    #: optimiser updates per step: one per (epoch, minibatch) of the step's rollouts (PPO)
    epochs: int = 1
    minibatches: int = 1

    @classmethod
    def check_config(cls, cfg) -> None:
        """Method-specific checks of the config, before any model is loaded (a one-line QeebmError)."""

    @classmethod
    def check_micro_batch(cls, cfg, size: int) -> None:
        """Whether one process's micro-batch of ``size`` sources (``optim.batch_size`` / (processes x
        ``optim.grad_accum``)) is enough for the method; a one-line QeebmError if not."""

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters of the method's own (PPO's value head), put in the loop's one
        optimiser, clipped with the model's and averaged over processes."""
        return []

    def before_step(self, batches: list[Batch], all_reduce) -> dict[str, float]:
        """Work of the whole step before its micro-steps, on this process's micro-batches
        (QE-dynamic's QE update, QE finetuning's teacher refresh). ``all_reduce(tensor)`` sums over
        processes. Returns metric contributions."""
        return {}

    def rollout(self, batch: Batch) -> Any:
        """Everything that needs no gradient: sampling, scoring, old log-probs."""
        raise NotImplementedError

    def finish_rollouts(self, rollouts: list, gather) -> list:
        """Once every micro-step's rollout exists: what needs the whole step (baselines, whitening,
        KL control). ``gather(tensor)`` concatenates a 1-d tensor over processes."""
        return rollouts

    def minibatch(self, rollout: Any, epoch: int, index: int) -> Any:
        """The part of ``rollout`` that update (``epoch``, ``index``) trains on."""
        return rollout

    def loss(self, rollout: Any) -> StepOutput:
        """The differentiable part, from what ``rollout`` (or ``minibatch``) returned."""
        raise NotImplementedError

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        """The quality estimators the method holds and never changes, by the ``qe.path`` they were
        loaded from: validation scores with these rather than loading a second copy of the same
        weights (2.2 GB at CometKiwi-22's size)."""
        return {}

    def state_dict(self) -> dict:
        """State the method owns (a QE and its optimiser, a baseline, a KL controller, a value head),
        saved in every checkpoint (``method.pt``) and restored on resume."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""

    def step_snapshot(self) -> Any:
        """Taken before every step: what ``undo_step`` needs to put ``state_dict`` back as the step
        found it. A preemption signal can stop a step at a micro-step, before its first optimiser
        update; the checkpoint is then the previous step's, and whatever the step's hooks changed
        (``before_step``, ``finish_rollouts``, ``loss``) must not reach it. The default copies the
        whole state, which is small for most methods. None: putting the state back would need a copy
        too large to take every step, and such a method's steps run to their end."""
        return copy.deepcopy(self.state_dict())

    def undo_step(self, snapshot: Any) -> None:
        """Put the state back as ``step_snapshot`` found it (the step was left before any update)."""
        self.load_state_dict(snapshot)
