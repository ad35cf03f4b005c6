"""The QE that QE-dynamic trains beside the translator: which parts learn, how, when, and how well.

QE-dynamic (docs/method.md) updates the QE once per optimiser step, on the step's labelled batch:
the reference against K of the translator's samples. Everything about the QE's side of that update
lives here: its trainable parts and their optimiser, the schedule (``qe.warmup_steps``,
``qe.interval``), the discrimination loss (NCE with the translator as noise, ranking NCE, or a
margin), the full-batch gradient step, the held-out correlation probe and the checkpointed state.
The translator's side (drawing the samples, their log-probabilities under the noise distribution)
stays in the method, which hands this class texts and numbers only.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from qeebm.config import QEConfig
from qeebm.errors import QeebmError
from qeebm.qe.heldout import HeldoutProbe, read_judged, ref_above_rate
from qeebm.qe.trainable import PARTS, trainable_parts
from qeebm.qe.trainable import scores as qe_scores

log = logging.getLogger(__name__)


def heldout_path(q: QEConfig) -> str:
    """The judged rows to measure the dynamic QE on: ``qe.heldout_path``, or under "auto" the
    ``heldout.tsv`` beside the QE's directory (the tiny world's ``qe/heldout.tsv`` next to
    ``qe/kiwi``) when there is one, so a recipe follows whichever world ``qe.path`` points at;
    "" when none."""
    if q.heldout_path != "auto":
        return q.heldout_path
    beside = Path(q.path).expanduser().parent / "heldout.tsv"
    return str(beside) if beside.is_file() else ""


def check_config(q: QEConfig) -> None:
    """The ``qe.*`` settings QE-dynamic needs, checked before anything is loaded."""
    for key, value, low in (("qe.interval", q.interval, 1), ("qe.warmup_steps", q.warmup_steps, 0),
                            ("qe.heldout_every", q.heldout_every, 1), ("qe.heldout_max_rows", q.heldout_max_rows, 0)):
        if value < low:
            raise QeebmError(f"config key '{key}' must be >= {low}; got {value}")
    unknown = [p for p in q.train_parts if p not in PARTS]
    if unknown:
        raise QeebmError(f"config key 'qe.train_parts' has unknown parts {unknown}; choose from {', '.join(PARTS)}")
    if q.mode == "dynamic" and not q.train_parts:
        raise QeebmError("qe.mode=dynamic needs at least one of qe.train_parts (head, layerwise, lora)")
    if q.mode == "dynamic" and heldout_path(q):
        read_judged(heldout_path(q), q.heldout_max_rows)  # a bad file fails now, not at the first measurement


class DynamicQE:
    """``qe`` (a CometKiwi) with the parts named by ``q.train_parts`` trainable by ``update`` only.

    The parts require grad only inside ``update``: the translator's energy never builds a graph into
    the QE, so the translator's backward cannot leave gradients on it, and the QE's parameters are in
    no optimiser but this one. Metrics are named ``{prefix}...`` (the method's namespace)."""

    def __init__(self, qe, q: QEConfig, seed: int, log_every: int, prefix: str = "qe-ebm/"):
        self.qe, self.q, self.prefix = qe, q, prefix
        # LoRA adapters are drawn from the run's seed in a forked RNG: every process draws the same.
        self.params = trainable_parts(qe, q.train_parts, lora_r=q.lora_r, lora_alpha=q.lora_alpha,
                                      lora_targets=q.lora_target_modules, seed=seed)
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=q.lr, weight_decay=q.weight_decay)
        # The held-out correlation is measured only on logged steps (the loop writes no other), and
        # ``measured_at`` is the number of updates the last measured QE had.
        self.log_every = log_every
        path = heldout_path(q)
        self.heldout = HeldoutProbe(path, q.heldout_max_rows) if path else None
        self.measured_at: int | None = None
        if q.heldout_path == "auto" and not path:
            log.info("qe.heldout_path=auto: no heldout.tsv beside %s, so no held-out correlation is measured", q.path)

    # ------------------------------------------------------------------------------- schedule
    def update_due(self, step: int) -> bool:
        return step > self.q.warmup_steps and step % self.q.interval == 0

    def updates_through(self, step: int) -> int:
        """Updates made in steps 1..``step``: the multiples of ``interval`` after the warm-up."""
        q = self.q
        return max(0, step // q.interval - q.warmup_steps // q.interval)

    def heldout_due(self, step: int) -> bool:
        if self.heldout is None or step % self.log_every:
            return False
        return self.measured_at is None or self.updates_through(step) - self.measured_at >= self.q.heldout_every

    # ------------------------------------------------------------------------------- training
    def loss(self, src: list[str], refs: list[str], sample_src: list[str], samples: list[str],
             logp_ref: torch.Tensor, logp_smp: torch.Tensor, k: int, global_examples: int
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """This micro-batch's contribution to the step's QE loss, and its statistics: N references
        of ``src`` against the K ``samples`` of each (N*K rows, a source's adjacent), with
        ``logp_*`` the translator's mean token log-probabilities of each (the noise term of NCE)."""
        n = len(src)
        with torch.enable_grad():
            scores = qe_scores(self.qe, list(src) + list(sample_src), list(refs) + list(samples),
                               logp_ref.device)  # [N + N*K]
        s_ref, s_smp = scores[:n], scores[n:]
        if self.q.loss in ("nce", "rank-nce"):
            # NCE with the translator as noise: logit = QE(x, y) - w * log pbar(y | x).
            w = self.q.noise_weight
            ref, smp = s_ref - w * logp_ref, s_smp - w * logp_smp
            if self.q.loss == "nce":
                total = F.binary_cross_entropy_with_logits(ref, torch.ones_like(ref), reduction="sum") + \
                    F.binary_cross_entropy_with_logits(smp, torch.zeros_like(smp), reduction="sum")
                loss = total / (global_examples * (1 + k))
            else:
                # Ranking NCE (Ma & Collins 2018): which of the reference and its K samples is the data?
                # Consistent for conditional models without a normalised QE, and a shift of every
                # logit of a source changes nothing, so "everything is noise" is no solution.
                logits = torch.cat([ref[:, None], smp.view(n, k)], dim=1)  # [N, 1 + K]
                loss = -F.log_softmax(logits, dim=1)[:, 0].sum() / global_examples
        else:
            ref, smp = s_ref, s_smp
            loss = F.relu(self.q.margin - (ref.repeat_interleave(k) - smp)).sum() / (global_examples * k)
        # Both a contribution to the step's mean over (reference, sample) pairs: by the loss's logit
        # (the QE score minus the noise term under NCE) and by the QE score alone, what the
        # translator's energy sees.
        share = n / global_examples
        p = self.prefix
        return loss, {f"{p}qe_loss": loss.item(), f"{p}ref_above_samples": ref_above_rate(ref, smp) * share,
                      f"{p}ref_score_above_samples": ref_above_rate(s_ref, s_smp) * share}

    def update(self, losses: Iterable[tuple[torch.Tensor, dict[str, float]]],
               all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """One optimiser step on the sum of ``losses`` (each micro-batch's contribution, produced
        lazily so that only one graph is alive at a time), summed over processes by ``all_reduce``:
        the full-batch gradient, the same on every process."""
        names = list(self.params)
        params = [self.params[n] for n in names]
        grads = [torch.zeros_like(p) for p in params]
        metrics: dict[str, float] = {}
        with self._trainable():
            for loss, stats in losses:
                for acc, g in zip(grads, torch.autograd.grad(loss, params, allow_unused=True)):
                    if g is not None:
                        acc.add_(g)
                for key, value in stats.items():
                    metrics[key] = metrics.get(key, 0.0) + value
        flat = all_reduce(torch.cat([g.flatten() for g in grads]))
        for p, g in zip(params, flat.split([g.numel() for g in grads])):
            p.grad = g.view_as(p).clone()
        if self.q.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.q.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return metrics

    @contextlib.contextmanager
    def _trainable(self):
        for p in self.params.values():
            p.requires_grad_(True)
        try:
            yield
        finally:
            for p in self.params.values():
                p.requires_grad_(False)

    def measure_heldout(self, step: int) -> dict[str, float]:
        """Pearson / Spearman of the current QE with the held-out true quality. Every process holds
        the same QE and measures the same; the loop sums metrics over processes, so each returns its
        share."""
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        updates = self.updates_through(step)
        corr = self.heldout.measure(self.qe)
        self.measured_at = updates
        log.info("QE-dynamic after %d update(s): held-out Pearson %.3f, Spearman %.3f (%d rows of %s)", updates,
                 corr["pearson"], corr["spearman"], len(self.heldout), self.heldout.path)
        p = self.prefix
        return {f"{p}heldout_pearson": corr["pearson"] / world, f"{p}heldout_spearman": corr["spearman"] / world,
                f"{p}heldout_updates": updates / world}

    # ------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"qe": {n: p.detach().cpu().clone() for n, p in self.params.items()},
                "qe_optimizer": self.optimizer.state_dict(), "heldout_measured_at": self.measured_at}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("qe", {})
        if set(saved) != set(self.params):
            raise QeebmError("the checkpoint's QE state does not match qe.train_parts")
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(saved[name])
        self.optimizer.load_state_dict(state["qe_optimizer"])
        self.measured_at = state.get("heldout_measured_at")
