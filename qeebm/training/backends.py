"""The loop under each accelerate backend: which ones it runs and why not the others, the Accelerator
itself, and the three places where DeepSpeed differs from DDP (the accumulation boundary, backward,
and the update, whose clipping and skipping DeepSpeed does itself).

Runs: one process, DDP (GPUs, or CPU processes over gloo) and DeepSpeed ZeRO stages 0-2 (model,
optimiser and a method's extra parameters in one engine; DeepSpeed shards gradients and optimiser
state, the weights stay whole on every process). Refused at start-up, with the reason:

* FSDP, and ZeRO-3: both shard the translator's weights. Every method samples from the translator
  with ``generate()`` at every step (and validation decodes with it, PPO reads its log-probs without
  gradients); on sharded weights each decoding step is a collective, so all processes would have to
  decode in lockstep (``synced_gpus``) through the wrapper, which the methods do not do. Besides,
  accelerate (1.15) builds FSDP only on GPU-type devices: on CPU an FSDP config silently runs DDP.

The method-owned models stay outside the engine on purpose: the frozen QE and PPO's reference copy
are placed on the process's device, whole, and run forward passes only; QE-dynamic's QE has its own
optimiser, whose gradients the method sums over processes itself (``before_step``).
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs, ProjectConfiguration

from qeebm.errors import QeebmError

UNSHARDED_WEIGHTS = ("the translator's weights must stay whole on every process: every method samples from them with "
                     "generate() at each step, which on sharded weights would need all processes to decode in lockstep")


# DeepSpeed (0.18 and later) hooks every autograd pass through the engine's parameters, a
# torch.autograd.grad too, and runs its gradient reduction at the end of each: an extra pass that
# measures a term's gradient breaks the step (0.19.8 fails with an IndexError in reduce_ipg_grads).
EXTRA_GRADIENT_PASSES = ("measuring each loss term's gradient takes extra autograd passes, which DeepSpeed treats as "
                         "backward passes of its own and reduces mid-step")


def _env_flag(name: str, env=None) -> bool:
    return (os.environ if env is None else env).get(name, "").lower() == "true"


def check_backend_request(cfg=None, env=None) -> None:
    """Refuse, before anything is loaded, a backend that shards the weights, and with a run's
    ``cfg``, what that run cannot do under the backend. ``env``: the variables accelerate's launcher
    gives the processes (default: this process's own); a recipe's check passes those the launch it
    plans for will give, so that it refuses what the workers would."""
    env = os.environ if env is None else env
    if _env_flag("ACCELERATE_USE_FSDP", env):
        raise QeebmError(f"FSDP is not supported: {UNSHARDED_WEIGHTS}; use DeepSpeed ZeRO-2 "
                         "(recipes/accelerate/deepspeed_zero2.yaml: gradients and optimiser state sharded) or DDP")
    deepspeed = _env_flag("ACCELERATE_USE_DEEPSPEED", env)
    if deepspeed and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2") == "3":
        raise QeebmError(f"DeepSpeed ZeRO-3 is not supported: {UNSHARDED_WEIGHTS}; use ZeRO-2 "
                         "(recipes/accelerate/deepspeed_zero2.yaml)")
    if cfg is not None and deepspeed and cfg.method == "qe-ebm" and cfg.qe_ebm.weighting == "relative":
        raise QeebmError(f"qe_ebm.weighting=relative is not supported under DeepSpeed: {EXTRA_GRADIENT_PASSES}; "
                         "use qe_ebm.weighting=absolute, or DDP")


def make_accelerator(cfg, run_dir) -> Accelerator:
    """The run's Accelerator: its mixed precision, its trackers (``logging.report_to``, TensorBoard
    under ``<run_dir>/tb``) and, under DeepSpeed without a GPU, the gloo process group."""
    check_backend_request(cfg)
    deepspeed = _env_flag("ACCELERATE_USE_DEEPSPEED")
    gpu = torch.cuda.is_available()
    kwargs = {}
    if deepspeed and not gpu and int(os.environ.get("LOCAL_RANK", -1)) != -1:
        # accelerate leaves the process-group backend unset on a machine without GPUs; under DeepSpeed
        # every launched process would then call itself rank 0 of 1. DeepSpeed's CPU accelerator
        # speaks gloo.
        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    # accelerate takes the DeepSpeed path only when not told cpu=True.
    accelerator = Accelerator(cpu=not gpu and not deepspeed, mixed_precision=cfg.optim.mixed_precision,
                              log_with=list(cfg.logging.report_to) or None,
                              project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "tb")),
                              **kwargs)
    if deepspeed and accelerator.state.deepspeed_plugin.zero_stage == 3:
        raise QeebmError(f"DeepSpeed ZeRO-3 is not supported: {UNSHARDED_WEIGHTS}; use ZeRO-2")
    return accelerator


def configure_deepspeed(accelerator, cfg) -> None:
    """Fill the DeepSpeed config from the run's: batch bookkeeping and clipping. Accumulation stays 1
    in DeepSpeed's eyes: the loop marks the boundary of every update itself (PPO makes several
    updates per step), and DeepSpeed would otherwise divide each loss by its accumulation count."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    o, world = cfg.optim, accelerator.num_processes
    micro = o.batch_size // (world * o.grad_accum)
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds.update({"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
               "train_batch_size": micro * world, "gradient_clipping": float(o.max_grad_norm)})


def deepspeed_engine(accelerator):
    """The DeepSpeed engine once prepared, else None."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return wrapped.engine if wrapped is not None else None


@contextlib.contextmanager
def micro_step(accelerator, model, last: bool):
    """Forward and backward of one micro-step: gradients are exchanged after the last one only."""
    engine = deepspeed_engine(accelerator)
    if engine is not None:
        engine.set_gradient_accumulation_boundary(last)
        yield
    else:
        with accelerator.no_sync(model) if not last else contextlib.nullcontext():
            yield


def backward(accelerator, loss: torch.Tensor) -> None:
    engine = deepspeed_engine(accelerator)
    if engine is not None:
        # Not accelerator.backward: under DeepSpeed it also steps, at every micro-step.
        engine.backward(loss)
    else:
        accelerator.backward(loss)


APPLIED, NONFINITE, OVERFLOW = "applied", "nonfinite", "overflow"


def apply_update(accelerator, optimizer, params, max_norm: float, loss_finite: bool) -> tuple[float, str]:
    """Clip and take the optimiser step, or skip it; gradients are cleared either way.

    Returns the gradient norm before clipping and what happened: ``applied``; ``nonfinite`` (skipped:
    the loss, agreed over processes, or the gradient norm is not finite); ``overflow`` (fp16: the loss
    scaler skipped the step and lowered its scale, as it does while it calibrates; not an error).
    Under DeepSpeed the engine clips (``gradient_clipping``) and skips a step with non-finite
    gradients itself, so a non-finite loss is caught through its gradients."""
    engine = deepspeed_engine(accelerator)
    if engine is not None:
        engine.step()
        norm = engine.get_global_grad_norm()
        norm = float("nan") if norm is None else float(norm)
        if engine.was_step_applied():
            return norm, APPLIED
        return norm, OVERFLOW if engine.fp16_enabled() and loss_finite else NONFINITE
    if not loss_finite:
        # Before clipping: an fp16 scaler that unscaled these gradients would expect its step.
        optimizer.zero_grad(set_to_none=True)
        return float("nan"), NONFINITE
    norm = float(accelerator.clip_grad_norm_(params, max_norm))
    # With a loss scaler, non-finite gradients of a finite loss are the scaler's to handle: it must
    # see them to lower its scale.
    if not math.isfinite(norm) and accelerator.scaler is None:
        optimizer.zero_grad(set_to_none=True)
        return norm, NONFINITE
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, OVERFLOW if accelerator.optimizer_step_was_skipped else APPLIED


class WithExtras(torch.nn.Module):
    """The translator and a method's own trainable parameters (PPO's value head) as one module:
    DeepSpeed's engine holds one module and optimises only parameters it can name in it. Calls go to
    the translator; the extras are used by the method directly."""

    def __init__(self, model: torch.nn.Module, extras: list[torch.nn.Parameter]):
        super().__init__()
        self.model = model
        self.extras = torch.nn.ParameterList(extras)  # the method's very Parameter objects, not copies

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def trained_parameters(accelerator, model, optimizer) -> list[torch.nn.Parameter]:
    """The parameters the updates train, as the model's own Parameter objects (for clipping and
    gradient diagnostics): the optimiser's; under DeepSpeed, whose optimiser holds flat partitions
    instead, the trainable ones of the engine's module (the method's extras included)."""
    if deepspeed_engine(accelerator) is not None:
        return [p for p in model.parameters() if p.requires_grad]
    return [p for group in optimizer.param_groups for p in group["params"]]


def module_to_prepare(accelerator, model: torch.nn.Module, extras: list) -> torch.nn.Module:
    """What goes into ``accelerator.prepare`` with the optimiser: under DeepSpeed the translator with
    the method's extra parameters; otherwise the translator (DDP wraps it alone; the loop averages
    the extras' gradients itself)."""
    if extras and accelerator.distributed_type == DistributedType.DEEPSPEED:
        return WithExtras(model, extras)
    return model


class PreparedModel:
    """The ``model`` a method is built with: the accelerate-prepared translator, once the loop has
    prepared it. Model and optimiser go through one ``accelerator.prepare`` call (DeepSpeed builds its
    engine only then), and the optimiser needs the method's extra parameters, so the method exists
    before the prepared model does; it only calls the model later, in ``rollout`` and ``loss``.
    Calls and attribute look-ups go to the prepared module."""

    def __init__(self):
        self._module = None

    def bind(self, module) -> None:
        self._module = module

    def _target(self):
        if self._module is None:
            raise RuntimeError("the prepared model is used before the loop prepared it")
        return self._module

    def __call__(self, *args, **kwargs):
        return self._target()(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._target(), name)


def agree_finite(accelerator, finite: bool) -> bool:
    """True when ``finite`` holds on every process (collective when there are several)."""
    if accelerator.num_processes == 1:
        return finite
    bad = torch.tensor([0.0 if finite else 1.0], device=accelerator.device)
    return accelerator.reduce(bad, "sum").item() == 0
