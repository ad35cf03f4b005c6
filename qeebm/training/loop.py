"""The one training loop, shared by every method.

Read top to bottom: ``train`` builds everything, then repeats ``train_step`` (rollouts of every
micro-step, then the optimiser update: backward, clipping, step; PPO asks for one update per epoch
and minibatch), logs, validates and checkpoints. A preemption signal stops the run at the next
micro-step, with the previous step's checkpoint (qeebm/training/preemption.py). The loop never looks inside a
method: it hands each micro-batch to ``method.rollout`` (no gradient) and the rollouts to
``method.loss``, and backpropagates what comes back (docs/design.md: batches and loss normalisation).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from qeebm.config import Config, flat_dict, to_dict
from qeebm.data.corpus import corpus_format, filter_corpus, read_corpus
from qeebm.data.step_sampler import StepSampler
from qeebm.errors import QeebmError
from qeebm.methods import METHODS, Batch
from qeebm.methods.common import reads_reference
from qeebm.methods.diagnostics import term_gradient_stats
from qeebm.metrics.sacrebleu import bleu_tokenizer, corpus_metrics
from qeebm.training import checkpoint as ckpt
from qeebm.training.backends import (
    APPLIED,
    EXTRA_GRADIENT_PASSES,
    NONFINITE,
    OVERFLOW,
    PreparedModel,
    agree_finite,
    apply_update,
    backward,
    configure_deepspeed,
    deepspeed_engine,
    make_accelerator,
    micro_step,
    module_to_prepare,
    trained_parameters,
)
from qeebm.training.preemption import Preemption, parse_signals
from qeebm.translation.decoding import corpus_nll, shard, translate_corpus
from qeebm.translation.translator import Translator, eval_mode

log = logging.getLogger("qeebm.training.loop")

QE_VAL_METRICS = ("kiwi", "judge")  # mean QE score of the decoded dev set
VAL_METRICS = ("bleu", "chrf", "loss") + QE_VAL_METRICS


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    best_metric: float | None
    best_path: Path | None
    preempted: bool = False  # stopped by a signal (output.preempt_signals); the same command resumes


@dataclass
class LoopState:
    """Everything besides tensors that a resume restores (saved as a checkpoint's state.json)."""

    step: int = 0
    best: float | None = None
    bad_evals: int = 0  # validations since the last improvement
    elapsed: float = 0.0
    validations: list[dict] = field(default_factory=list)
    also_best: dict[str, float] = field(default_factory=dict)  # eval.also_best metric -> its best value
    nonfinite_steps: int = 0  # steps skipped for a non-finite loss or gradient norm, in all
    nonfinite_in_a_row: int = 0  # ... and the current streak of them (optim.max_nonfinite_steps)


def train(cfg: Config) -> TrainResult:
    run_dir = Path(cfg.output.run_dir)
    check_trackers(cfg)
    accelerator = make_accelerator(cfg, run_dir)
    set_seed(cfg.seed)
    check_config(cfg, accelerator.num_processes)
    newest = ckpt.prepare_run_dir(cfg, run_dir, accelerator)
    handler = _FileLog(run_dir / "train.log") if accelerator.is_main_process else None
    metrics_log = None
    try:
        # Checked before anything is loaded; a damaged checkpoint is set aside for an older intact one.
        resume_from = ckpt.resume_checkpoint(run_dir / "checkpoints", accelerator) if newest is not None else None
        translator = Translator.load(cfg.model)
        # An adapter run's checkpoints hold only what trains, and record the frozen base it needs. Every
        # process digests the base: each checks it before loading a checkpoint, so all stop alike.
        base = ckpt.base_record(translator.base_name_or_path) if translator.adapters_only else None
        if base is not None:
            log.info("adapters: checkpoints hold the trainable tensors only; frozen base %s (weights sha256 %s)",
                     base["name_or_path"], base["sha256"][:12])
        train_set, dev_set = load_data(cfg, translator)

        model = translator.model
        # Model and optimiser go through accelerate in one call (DeepSpeed builds its engine only
        # from both), and the optimiser covers the method's own trainable parameters (PPO's value
        # head, ``extra_parameters``): so the method is built first, on the device, with a handle
        # that becomes the prepared model (backends.PreparedModel). No DataLoader: the step sampler
        # already gives each process its slice.
        translator.to(accelerator.device)
        handle = PreparedModel()
        method = METHODS[cfg.method](cfg, translator, handle)
        extras = method.extra_parameters()
        params = [p for p in model.parameters() if p.requires_grad] + extras
        o = cfg.optim
        optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        # Not prepared by accelerate: its wrapper steps the schedule once per process.
        budget = Budget.of(cfg, len(train_set.src))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(o.scheduler, o.warmup_steps, budget.max_steps))
        if resume_from is not None:
            # Weights before prepare: DeepSpeed copies them into its own optimiser partitions there.
            ckpt.check_base(resume_from, base)
            ckpt.load_model(resume_from, model)
        configure_deepspeed(accelerator, cfg)
        prepared, optimizer = accelerator.prepare(module_to_prepare(accelerator, model, extras), optimizer)
        handle.bind(prepared)
        state = LoopState()
        if resume_from is not None:
            state = LoopState(**ckpt.load_training_state(resume_from, optimizer=optimizer, scheduler=scheduler, accelerator=accelerator))
            ckpt.load_method_state(resume_from, method)
            log.info("resuming from %s (step %d)", resume_from, state.step)
        sampler = StepSampler(len(train_set.src), o.batch_size, cfg.seed)
        # The source-only pool gets its own stream (another seed), as pure in the step as the labelled one.
        mono = load_mono(cfg, translator, method.needs_reference) if method.needs_mono else None
        mono_sampler = StepSampler(len(mono.src), o.batch_size, cfg.seed + 1) if mono is not None else None
        # A fresh start keeps none of an earlier attempt's records (it validates step 0 again).
        metrics_log = MetricsLog(run_dir, cfg, accelerator, start_step=state.step if resume_from is not None else -1)
        log.info("backend %s", accelerator.distributed_type.name)
        if cfg.logging.diagnostics and deepspeed_engine(accelerator) is not None and accelerator.is_main_process:
            log.warning("logging.diagnostics is off under DeepSpeed: %s", EXTRA_GRADIENT_PASSES)
        log.info("method %s, %d processes x %d micro-steps, global batch %d, %d trainable parameters, %d training pairs",
                 cfg.method, accelerator.num_processes, o.grad_accum, o.batch_size, sum(p.numel() for p in params), len(train_set.src))
        log.info("budget: %s", budget.describe())
        if dev_set is not None:
            log.info("validation BLEU: sacrebleu's %s tokenizer (target %s)",
                     bleu_tokenizer(cfg.model.tgt_lang, cfg.eval.bleu_tokenize or None), cfg.model.tgt_lang)
        if resume_from is not None and not ckpt.restore_rng(resume_from, accelerator.process_index):
            log.warning("checkpoint has no RNG state for process %d: dropout will differ", accelerator.process_index)

        qe_scorers = ValidationScorers(cfg, accelerator.device, shared=method.frozen_qes())

        def validate_and_select() -> None:
            # prepared is in train mode here (set before the loop; methods restore modes), so eval_mode
            # hands it back in train mode.
            with ckpt.preserve_rng(), eval_mode(prepared):
                result, seconds = validate(cfg, translator, dev_set, accelerator, qe_scorers)
            value = result[cfg.eval.metric]
            improved = state.best is None or (value > state.best if cfg.eval.mode == "max" else value < state.best)
            state.best, state.bad_evals = (value, 0) if improved else (state.best, state.bad_evals + 1)
            state.validations.append({"step": state.step, **result})
            metrics_log.write(state.step, {f"val/{k}": v for k, v in result.items()}
                              | {f"val/seconds_{k}": v for k, v in seconds.items()} | {"elapsed": time.time() - start})
            chosen = [("best", cfg.eval.metric)] if improved else []
            for name in cfg.eval.also_best:
                old, new = state.also_best.get(name), result[name]
                if old is None or (new < old if name == "loss" else new > old):
                    state.also_best[name] = new
                    chosen.append((f"best-{name}", name))
            if chosen and accelerator.is_main_process:
                for dirname, metric in chosen:
                    with ckpt.atomic_dir(run_dir / dirname) as tmp:
                        translator.save(tmp)
                    log.info("new best %s=%.4f at step %d -> %s", metric, result[metric], state.step, run_dir / dirname)
            accelerator.wait_for_everyone()

        def save() -> None:
            state.elapsed = time.time() - start
            ckpt.save_checkpoint(run_dir / "checkpoints", state.step, model=model, optimizer=optimizer, scheduler=scheduler,
                                 state=asdict(state), accelerator=accelerator, keep_last=cfg.output.keep_last,
                                 method_state=method.state_dict(),
                                 optimizer_per_process=deepspeed_engine(accelerator) is not None, base=base)

        def stopped_early() -> bool:
            return 0 < cfg.eval.patience <= state.bad_evals and state.step >= budget.min_steps

        start = time.time() - state.elapsed
        prepared.train()
        bar = tqdm(total=budget.max_steps, initial=state.step, disable=not (accelerator.is_main_process and cfg.logging.progress_bar))
        dropped = None  # a step left at a micro-step by preemption
        with Preemption(cfg.output.preempt_signals) as preemption:
            if cfg.eval.at_start and dev_set is not None and state.step == 0 and not state.validations:
                validate_and_select()
            while state.step < budget.max_steps and not stopped_early():
                state.step += 1
                # What a step left at a micro-step puts back; None: the method's steps run to their end.
                undo = method.step_snapshot()
                rng = ckpt.rng_state() if undo is not None else None
                metrics = train_step(state.step, cfg, accelerator, translator, prepared, method, optimizer, scheduler, sampler,
                                     train_set, mono=mono, mono_sampler=mono_sampler,
                                     stop=(lambda: preemption.requested(accelerator)) if undo is not None else None)
                if metrics is None:
                    # Left before its first update: weights, optimiser and schedule are the previous
                    # step's, and so, once put back, are the generators and the method's state. The
                    # step's partial gradients are dropped; the resumed run draws the same batch again.
                    ckpt.set_rng_state(rng)
                    method.undo_step(undo)
                    dropped = state.step
                    state.step -= 1
                    break
                count_nonfinite(state, metrics, cfg, run_dir)
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}")
                if state.step % cfg.logging.every == 0:
                    epoch = state.step * o.batch_size / len(train_set.src)
                    metrics_log.write(state.step, {"epoch": epoch, **metrics, "elapsed": time.time() - start})
                if dev_set is not None and budget.eval_every > 0 and state.step % budget.eval_every == 0:
                    validate_and_select()
                if cfg.output.save_every > 0 and state.step % cfg.output.save_every == 0:
                    save()
                if preemption.requested(accelerator):
                    break
        bar.close()
        if preemption.received is not None:
            if not ckpt.step_dir(run_dir / "checkpoints", state.step).is_dir():
                save()
            left = f" (step {dropped} was left at a micro-step and runs again on resume)" if dropped is not None else ""
            message = (f"preempted by {preemption.received} after step {state.step} of {budget.max_steps}{left}: checkpoint "
                       f"{ckpt.step_dir(run_dir / 'checkpoints', state.step)} written; run the same command to resume")
            log.warning(message)
            if accelerator.is_main_process:
                print(message, flush=True)
            return TrainResult(run_dir=run_dir, step=state.step, best_metric=state.best,
                               best_path=run_dir / "best" if state.best is not None else None, preempted=True)
        if stopped_early():
            log.info("early stop at step %d: no %s improvement in %d validations", state.step, cfg.eval.metric, state.bad_evals)
        if dev_set is not None and not any(v["step"] == state.step for v in state.validations):
            validate_and_select()
        if not ckpt.step_dir(run_dir / "checkpoints", state.step).is_dir():
            save()
        if accelerator.is_main_process:
            with ckpt.atomic_dir(run_dir / "final") as tmp:
                translator.save(tmp)
        accelerator.wait_for_everyone()
        best = run_dir / "best" if state.best is not None else None
        return TrainResult(run_dir=run_dir, step=state.step, best_metric=state.best, best_path=best)
    finally:
        if metrics_log is not None:
            metrics_log.close()
        if handler is not None:
            handler.close()


@dataclass(frozen=True)
class Budget:
    """How long a run trains, in optimiser steps: ``max_steps`` (the smaller of optim.max_steps and
    optim.max_epochs' steps, where on), ``min_steps`` (optim.min_epochs': early stopping waits for
    them) and ``eval_every`` (eval.every, at most one epoch's steps under an epoch budget)."""

    max_steps: int
    min_steps: int
    eval_every: int
    steps_per_epoch: float

    @classmethod
    def of(cls, cfg, n_train: int) -> "Budget":
        o = cfg.optim
        per_epoch = n_train / o.batch_size

        def steps(epochs: float) -> int:
            # rounded first: 3 epochs of 300 pairs in batches of 16 is 56.25 steps, not 56.250000001
            return math.ceil(round(epochs * per_epoch, 6))

        bounds = [o.max_steps] if o.max_steps > 0 else []
        every = cfg.eval.every
        if o.max_epochs > 0:
            bounds.append(steps(o.max_epochs))
            every = min(every, steps(1)) if every > 0 else 0
        return cls(max_steps=min(bounds), min_steps=steps(o.min_epochs), eval_every=every, steps_per_epoch=per_epoch)

    def describe(self) -> str:
        text = f"{self.max_steps} steps ({self.max_steps / self.steps_per_epoch:.3g} epochs of the labelled pairs)"
        if self.min_steps:
            text += f", no early stop before step {self.min_steps}"
        return text + (f", validation every {self.eval_every} steps" if self.eval_every else "")


def train_step(step, cfg, accelerator, translator, model, method, optimizer, scheduler, sampler, data,
               mono=None, mono_sampler=None, stop=None) -> dict[str, float] | None:
    """One step of the loop over the global batch of ``step``: rollouts, then one optimiser update
    (or, for PPO, one per epoch and minibatch). Every micro-step's loss is its contribution to the
    update's mean, so the summed gradient is the full-batch gradient.

    ``stop`` (collective) is asked before every micro-batch's rollout and before every micro-step of
    the first update; when it says yes the step is left there and None returned. Nothing has been
    applied by then: the caller puts back what the step changed besides (generators, method state).
    After the first update is applied (PPO makes several) the step runs to its end."""
    world, accum, rank = accelerator.num_processes, cfg.optim.grad_accum, accelerator.process_index
    # ``step`` counts from 1 (steps done once it ends); the sampler's steps count from 0.
    every = sampler.global_indices(step - 1)
    global_tokens = count_label_tokens(translator, data, every)
    batches = []
    for micro in range(accum):
        idx = sampler.local_indices(step - 1, micro, rank, world, accum)
        batch = make_batch(translator, data, idx, global_tokens, len(every), accelerator.device, step=step)
        if mono is not None:
            picked = mono_sampler.local_indices(step - 1, micro, rank, world, accum)
            batch.mono = [mono.src[i] for i in picked]
            batch.mono_ref = [mono.tgt[i] for i in picked] if mono.tgt is not None else None
            batch.global_mono = mono_sampler.global_batch
        batches.append(batch)
    sums: dict[str, float] = {"loss": 0.0}
    # Work of the whole step that must precede its micro-steps (QE-dynamic's QE update); the method
    # sums what it needs over processes itself, through this callable.
    for key, value in method.before_step(batches, lambda t: accelerator.reduce(t, "sum")).items():
        sums[key] = sums.get(key, 0.0) + float(value)
    # 1. Rollouts of every micro-batch, without gradients: samples, scores, old log-probs.
    rollouts = []
    for batch in batches:
        if stop is not None and stop():
            return None
        with torch.no_grad():
            rollouts.append(method.rollout(batch))
    # 2. What needs the whole step (baselines, advantage whitening, the KL controller): the method
    #    sees every process's rollouts through ``gather`` (concatenation over processes).
    rollouts = method.finish_rollouts(rollouts, accelerator.gather)
    # 3. Updates: one optimiser update per (epoch, minibatch) of the rollouts, 1 x 1 unless the
    #    method asks for more (PPO). Each micro-batch contributes its share of the minibatch.
    epochs, minibatches = method.epochs, method.minibatches
    params = trained_parameters(accelerator, model, optimizer)
    extra = method.extra_parameters()
    # With clipping off, an infinite threshold still measures the norm and scales by exactly 1.
    max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
    # Gradient diagnostics on the logged steps, from the first micro-batch of the first update; not
    # under DeepSpeed, which takes their extra gradient passes for backward passes (backends.py).
    diagnose = cfg.logging.diagnostics and step % cfg.logging.every == 0 and deepspeed_engine(accelerator) is None
    updates: dict[str, float] = {"loss": 0.0}
    values: dict[str, float] = {}  # the step's own numbers (StepOutput.values), from its first micro-batch
    grad_norm = 0.0
    outcomes = []
    for epoch in range(epochs):
        for part in range(minibatches):
            losses = []
            for micro, rollout in enumerate(rollouts):
                if stop is not None and epoch == part == 0 and stop():
                    return None
                # Gradients are exchanged once, on the last micro-step.
                with micro_step(accelerator, model, last=micro == accum - 1):
                    out = method.loss(method.minibatch(rollout, epoch, part))
                    if epoch == part == micro == 0:
                        values = dict(out.values)
                    if diagnose and epoch == part == micro == 0 and len(out.terms) > 1:
                        # A mean over processes: each measured its own micro-batch.
                        stats = out.gradient_stats
                        for key, value in (stats if stats is not None else term_gradient_stats(out.terms, params)).items():
                            sums[f"diag/{key}"] = value / world
                    # DDP averages gradients over processes; the contributions must be summed.
                    backward(accelerator, out.loss * world)
                losses.append(out.loss.item())
                for key, value in out.metrics.items():
                    updates[key] = updates.get(key, 0.0) + float(value)
            updates["loss"] += sum(losses)
            average_gradients(accelerator, extra)
            norm, outcome = apply_update(accelerator, optimizer, params, max_norm,
                                         loss_finite=agree_finite(accelerator, all(map(math.isfinite, losses))))
            grad_norm += norm
            outcomes.append(outcome)
    lr = scheduler.get_last_lr()[0]
    if NONFINITE in outcomes:
        log_nonfinite(step, outcomes, every, mono_sampler.global_indices(step - 1) if mono is not None else None)
    # One schedule step per optimiser step of the loop, however many updates it made (as TRL's PPO);
    # none when an update was skipped, so a skipped step leaves the schedule where it was.
    if all(outcome == APPLIED for outcome in outcomes):
        scheduler.step()
    # Logged: the mean over updates of each update's total, plus the once-per-step metrics.
    n_updates = epochs * minibatches
    for key, value in updates.items():
        sums[key] = sums.get(key, 0.0) + value / n_updates
    keys = sorted(sums)
    totals = accelerator.reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=accelerator.device), "sum")
    # grad_norm is already the same on every process: not summed; so are the updates' outcomes and
    # the step's values.
    return {"lr": lr, "grad_norm": grad_norm / n_updates, "nonfinite": float(outcomes.count(NONFINITE)),
            "overflow": float(outcomes.count(OVERFLOW)), **dict(zip(keys, totals.tolist())), **values}


def lr_factor(kind: str, warmup: int, total: int):
    """The schedule's factor of ``optim.lr`` for the update at index s (0 = the first): a linear
    warm-up over ``warmup`` updates that starts at lr / warmup, not at 0 (an update at lr 0 would
    waste the step: for PPO a whole rollout), then constant, linear to 0 at ``total`` (never reached:
    the last update, s = total - 1, keeps 1 / (total - warmup)) or a half cosine."""
    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = (s - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return factor


def log_nonfinite(step, outcomes, labelled, mono) -> None:
    """Name the examples of a step with a skipped update, so a bad batch can be found in the data."""
    log.warning("step %d: %d of %d update(s) skipped for a non-finite loss or gradient norm; the step's examples: "
                "training pairs %s%s", step, outcomes.count(NONFINITE), len(outcomes), list(labelled),
                f", source-only sentences {list(mono)}" if mono is not None else "")


def count_nonfinite(state: LoopState, metrics: dict, cfg, run_dir: Path) -> None:
    """Keep the streak of steps with a skipped update; stop the run at ``optim.max_nonfinite_steps``
    in a row. The weights are those of the last good step, and the checkpoints on disk stay as they are."""
    if not metrics["nonfinite"]:
        state.nonfinite_in_a_row = 0
        return
    state.nonfinite_steps += 1
    state.nonfinite_in_a_row += 1
    limit = cfg.optim.max_nonfinite_steps
    if 0 < limit <= state.nonfinite_in_a_row:
        last = ckpt.latest_checkpoint(run_dir / "checkpoints")
        raise QeebmError(f"{state.nonfinite_in_a_row} steps in a row (to step {state.step}) had a non-finite loss or gradient "
                         f"norm (optim.max_nonfinite_steps={limit}); stopped, the last good checkpoint is "
                         f"{last if last is not None else 'none (none was written yet)'}; train.log names each step's examples")


def average_gradients(accelerator, params) -> None:
    """Average gradients over processes, as DDP does for the model's own parameters: a method's
    extra parameters live outside the DDP wrapper. DeepSpeed reduces every parameter of its
    optimiser, the method's included."""
    if accelerator.num_processes == 1 or deepspeed_engine(accelerator) is not None:
        return
    for p in params:
        if p.grad is not None:
            p.grad.copy_(accelerator.reduce(p.grad, "mean"))


def make_batch(translator, data, idx, global_tokens, global_examples, device, step=0) -> Batch:
    src = [data.src[i] for i in idx]
    tgt = [data.tgt[i] for i in idx] if data.tgt is not None else None
    enc = {k: v.to(device) for k, v in translator.encode(src, tgt).items()}
    return Batch(src=src, tgt=tgt, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=enc.get("labels"),
                 decoder_input_ids=enc.get("decoder_input_ids"),
                 global_tokens=global_tokens, global_examples=global_examples, step=step)


def count_label_tokens(translator, data, idx) -> int:
    # Every process tokenises the whole step's targets, so all agree on the normaliser without talking.
    if data.tgt is None:
        return 0
    labels = translator.encode([data.src[i] for i in idx], [data.tgt[i] for i in idx])["labels"]
    return int((labels != -100).sum())


def validate(cfg, translator, dev, accelerator, qe_scorers=None) -> tuple[dict[str, float], dict[str, float]]:
    """Validation metrics of the dev set (its first ``eval.max_examples``), and the seconds each
    part took: decoding, BLEU/chrF++, NLL and every QE metric."""
    n = cfg.eval.max_examples or len(dev.src)
    src, tgt = dev.src[:n], dev.tgt[:n]
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    hyps = translate_corpus(translator, src, cfg.generation, accelerator)
    seconds["decode"] = time.perf_counter() - t
    t = time.perf_counter()
    result = corpus_metrics(hyps, tgt, bleu_tokenizer(cfg.model.tgt_lang, cfg.eval.bleu_tokenize or None))
    seconds["sacrebleu"] = time.perf_counter() - t
    t = time.perf_counter()
    result["loss"] = corpus_nll(translator, src, tgt, cfg.generation.batch_size, accelerator)
    seconds["loss"] = time.perf_counter() - t
    for name, scorer in (qe_scorers.items() if qe_scorers is not None else []):
        t = time.perf_counter()
        result[name] = mean_qe_score(scorer, src, hyps, accelerator, refs=tgt)
        seconds[name] = time.perf_counter() - t
    return result, seconds


def validation_qe_metrics(cfg) -> list[str]:
    """The QE metrics every validation computes: those listed, selected on, or kept a best of."""
    wanted = set(cfg.eval.qe_metrics) | {cfg.eval.metric} | set(cfg.eval.also_best)
    return [name for name in QE_VAL_METRICS if name in wanted]


def qe_metric_path(cfg, name: str) -> str:
    if name == "kiwi":
        return cfg.eval.kiwi_path or cfg.qe.path
    if not cfg.eval.judge_path:
        raise QeebmError("validation metric 'judge' needs a held-out QE: set eval.judge_path")
    return cfg.eval.judge_path


class ValidationScorers(dict):
    """name -> QEScorer of each validation QE metric, loaded at the first validation and kept
    (a CometKiwi takes seconds to load; scores of repeated dev outputs come from the cache).
    ``shared``: QE models already in memory and never changed, by path (``Method.frozen_qes``);
    a metric on one of those paths scores with it instead of a second copy."""

    def __init__(self, cfg, device, shared: dict | None = None):
        super().__init__()
        self.cfg, self.device, self.loaded = cfg, device, False
        self.shared = shared or {}

    def items(self):
        if not self.loaded:
            from qeebm.qe.models import load_qe
            from qeebm.qe.scoring import QEScorer

            for name in validation_qe_metrics(self.cfg):
                # comet builds random modules before loading weights: the run's RNG stays untouched.
                path = qe_metric_path(self.cfg, name)
                if path in self.shared:
                    self[name] = QEScorer(self.shared[path])
                    continue
                with torch.random.fork_rng(devices=[]):
                    self[name] = QEScorer(load_qe(path).to(self.device))
            self.loaded = True
        return super().items()


def mean_qe_score(scorer, src: list[str], hyps: list[str], accelerator=None, refs: list[str] | None = None) -> float:
    """Mean QE score of (src, hyp) pairs; each process scores its shard of a corpus every process
    holds whole, and the sums are added up. ``refs`` go to a scorer that reads them (a
    reference-based COMET), never to a reference-free one."""

    idx = shard(list(range(len(src))), accelerator)
    device = accelerator.device if accelerator is not None else torch.device("cpu")
    extra = [[refs[i] for i in idx]] if refs is not None and reads_reference(scorer) else []
    total = torch.tensor([sum(scorer.score([src[i] for i in idx], [hyps[i] for i in idx], *extra)) if idx else 0.0,
                          float(len(idx))], dtype=torch.float64, device=device)
    if accelerator is not None and accelerator.num_processes > 1:
        total = accelerator.reduce(total, "sum")
    return (total[0] / total[1].clamp(min=1)).item()


# ----------------------------------------------------------------------------------------------
# Set-up helpers


def load_data(cfg, translator):
    d = cfg.data
    train_set = read_corpus(d.train, "train", need_target=True, on_error=d.on_error, log=log)
    train_set = filter_corpus(train_set, max_tokens=d.max_tokens, dedup=d.dedup, log=log,
                              count_src=lambda texts: translator.num_tokens(texts, "src"),
                              count_tgt=lambda texts: translator.num_tokens(texts, "tgt"))
    # An empty dev path turns validation (and best-checkpoint selection) off.
    dev_set = read_corpus(d.dev, "dev", need_target=True, on_error=d.on_error, log=log) if d.dev.path else None
    return train_set, dev_set


def load_mono(cfg, translator, need_reference: bool = False):
    """The source-only pool, length-filtered on the source side like the training pairs. With
    ``need_reference`` (a reference-based energy or reward) each sentence's reference is read too,
    from the pool's target column, and filtered like a training target."""
    d = cfg.data
    if not d.mono.path:
        raise QeebmError(f"method '{cfg.method}' needs a source-only pool: set data.mono.path")
    if need_reference and corpus_format(d.mono, "mono") == "text" and not d.mono.tgt_path:
        raise QeebmError(f"{d.mono.path}: qe.path {cfg.qe.path} reads the reference of every pool sentence, but "
                         f"the pool is plain text: give a TSV with columns '{d.mono.src_column}' and "
                         f"'{d.mono.tgt_column}', a JSONL with those keys, or data.mono.tgt_path")
    mono = read_corpus(d.mono, "mono", need_target=need_reference, on_error=d.on_error, log=log)
    return filter_corpus(mono, max_tokens=d.max_tokens, dedup=d.dedup, log=log,
                         count_src=lambda texts: translator.num_tokens(texts, "src"),
                         count_tgt=lambda texts: translator.num_tokens(texts, "tgt"))


def check_batch_split(cfg, world: int, accum: int) -> None:
    """Whether ``optim.batch_size``, the global batch of one step, splits into ``world`` processes x
    ``accum`` micro-steps of equal micro-batches the method can train on (a one-line QeebmError if not)."""
    o = cfg.optim
    if accum < 1 or o.batch_size % (world * accum):
        raise QeebmError(f"optim.batch_size={o.batch_size} must be divisible by processes x optim.grad_accum = "
                         f"{world} x {accum}; batch_size is the global batch of one optimiser step")
    METHODS[cfg.method].check_micro_batch(cfg, o.batch_size // (world * accum))


def check_config(cfg, world: int) -> None:
    """What can be wrong before anything slow is loaded."""
    METHODS[cfg.method].check_config(cfg)  # an unknown name raises, naming the closest
    o = cfg.optim
    for key, value in (("optim.max_steps", o.max_steps), ("optim.max_epochs", o.max_epochs),
                       ("optim.min_epochs", o.min_epochs)):
        if value < 0:
            raise QeebmError(f"{key} must be >= 0 (0: off); got {value}")
    if o.max_steps == 0 and o.max_epochs == 0:
        raise QeebmError("optim.max_steps and optim.max_epochs are both 0: the run would never stop; set one of them")
    if o.max_epochs and o.min_epochs > o.max_epochs:
        raise QeebmError(f"optim.min_epochs={o.min_epochs} is more than optim.max_epochs={o.max_epochs}")
    check_batch_split(cfg, world, o.grad_accum)
    if cfg.eval.metric not in VAL_METRICS:
        raise QeebmError(f"eval.metric must be one of {', '.join(VAL_METRICS)}; got {cfg.eval.metric!r}")
    for key, names, allowed in (("eval.qe_metrics", cfg.eval.qe_metrics, QE_VAL_METRICS),
                                ("eval.also_best", cfg.eval.also_best, VAL_METRICS)):
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise QeebmError(f"{key} has unknown metrics {unknown}; choose from {', '.join(allowed)}")
    if cfg.data.dev.path:
        from qeebm.qe.models import resolve_checkpoint

        try:
            bleu_tokenizer(cfg.model.tgt_lang, cfg.eval.bleu_tokenize or None)
        except QeebmError as err:
            raise QeebmError(f"validation BLEU: {err}") from None

        for name in validation_qe_metrics(cfg):
            # A missing QE fails now, not at the first validation.
            try:
                resolve_checkpoint(qe_metric_path(cfg, name))
            except QeebmError as err:
                raise QeebmError(f"validation metric '{name}': {err}") from None
    if cfg.logging.every < 1:
        raise QeebmError(f"logging.every must be at least 1; got {cfg.logging.every}")
    if o.max_nonfinite_steps < 0:
        raise QeebmError(f"optim.max_nonfinite_steps must be >= 0 (0: never stop); got {o.max_nonfinite_steps}")
    parse_signals(cfg.output.preempt_signals)


class _FileLog:
    """train.log: the package's INFO messages in the run directory (main process only); detached
    again on close, so several runs in one Python process never write into each other's logs."""

    def __init__(self, path: Path):
        self.logger = logging.getLogger("qeebm")
        self.level = self.logger.level
        self.handler = logging.FileHandler(path, encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        self.logger.addHandler(self.handler)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()
        self.logger.setLevel(self.level)


def check_trackers(cfg) -> None:
    """Each of ``logging.report_to`` must be one of accelerate's trackers, and installed."""
    installed = {str(t) for t in get_available_trackers()}
    for name in cfg.logging.report_to:
        if name not in LOGGER_TYPE_TO_CLASS:
            raise QeebmError(f"logging.report_to: unknown tracker {name!r}; choose from {', '.join(sorted(LOGGER_TYPE_TO_CLASS))}")
        if name not in installed:
            raise QeebmError(f"logging.report_to: tracker {name!r} is not installed (pip install {name}), "
                             "or leave it out of logging.report_to")


def tracker_config(cfg) -> dict:
    """The resolved config as the flat dotted scalars every tracker accepts (lists as strings)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flat_dict(to_dict(cfg)).items()}


class MetricsLog:
    """metrics.jsonl (one JSON object per line) and the trackers of ``logging.report_to`` (through
    accelerate), written by the main process only. On resume, records past the checkpoint's step
    (``start_step``; -1 for a fresh start, which keeps none) are dropped (TensorBoard: purged) so
    the curves never hold a step twice."""

    def __init__(self, run_dir: Path, cfg, accelerator, start_step: int):
        self.active = accelerator.is_main_process
        self.path, self.accelerator = run_dir / "metrics.jsonl", None
        if not self.active:
            return
        kept, broken = [], 0
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line)["step"] <= start_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    broken += 1  # a line cut short by a crash
        if broken:
            log.warning("%s: dropped %d unreadable line(s), most likely cut short by a crash", self.path, broken)
        ckpt.write_text_atomic(self.path, "".join(line + "\n" for line in kept))
        if cfg.logging.report_to:
            self.accelerator = accelerator
            accelerator.init_trackers("qeebm", config=tracker_config(cfg), init_kwargs={
                "tensorboard": {"purge_step": start_step + 1},
                "wandb": {"dir": str(run_dir), "name": run_dir.name},
                "mlflow": {"run_name": run_dir.name}})

    def write(self, step: int, values: dict[str, float]) -> None:
        if not self.active:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        log.info("step %d: %s", step, " ".join(f"{k}={v:.4g}" for k, v in values.items() if k != "elapsed"))
        if self.accelerator is not None:
            self.accelerator.log({key if "/" in key else f"train/{key}": value for key, value in values.items()}, step=step)

    def close(self) -> None:
        # Not accelerator.end_training(): it also ends the process group, which the next run of a
        # recipe in this process still needs.
        if self.accelerator is not None:
            for tracker in self.accelerator.trackers:
                tracker.finish()
            self.accelerator.trackers = []
