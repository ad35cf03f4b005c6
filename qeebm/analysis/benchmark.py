"""Where a training step's time goes: the instruments of ``python scripts/bench.py --what step``.

A ``PhaseTimer`` wraps the functions that do a step's heavy work and charges each call's time to a
phase, exclusive of the phases nested inside it, so the phases and "other" add up to the step:

    sampling      ``Translator.generate_ids``, everything under it included (the model's calls too)
    replay        a translator forward outside generation: teacher-forced log-probs, the energy's
                  logits, PPO's reference model and values
    relax+bridge  ``KiwiEnergy._relax`` and ``Bridge.shift``: the relaxation and the vocabulary bridge
    alignment     ``Bridge.align``: samples decoded to text and aligned with the QE's pieces
    qe forward    the QE encoder (reward scoring, the energy, QE-dynamic's update)
    backward      ``torch.autograd.backward`` and ``torch.autograd.grad`` (the latter is the relative
                  weighting's gradient-norm measurement)
    optimiser     ``Optimizer.step`` (the translator's, and QE-dynamic's own)
    other         the rest of the step: Python, tokenisation, guards, loss assembly, clipping

Each forward also counts its FLOP floor: 2 x (matrix-multiply parameters) x (real, unpadded tokens)
for a forward, the same again for the activation gradients of a forward whose output needs a
gradient, plus 2 x (trained matrix parameters) x tokens for its weight gradients. Embedding lookups
are not matrix multiplies; attention's score and mix products are left out (short sequences: a few
per cent). Generation's floor: the encoder once over the sources, the decoder and output layer once
per emitted token (cached decoding, nothing recomputed).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict

import torch

import qeebm.qe.energy
import qeebm.qe.scoring
import qeebm.training.loop
from qeebm.qe.bridge import Bridge
from qeebm.qe.energy import KiwiEnergy
from qeebm.translation.translator import Translator

PHASES = ("sampling", "replay", "relax+bridge", "alignment", "qe forward", "backward", "optimiser", "other")


def linear_params(module: torch.nn.Module, trained_only: bool = False) -> int:
    """Weights of the module's matrix multiplies (``nn.Linear``; biases and embeddings left out)."""
    return sum(m.weight.numel() for m in module.modules()
               if isinstance(m, torch.nn.Linear) and (m.weight.requires_grad or not trained_only))


def seq2seq_parts(model) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """(encoder, decoder, output layer) of an M2M100 / MBart model, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.encoder, base.model.decoder, base.lm_head


def translator_flops(model, enc_tokens: int, dec_tokens: int) -> tuple[float, float]:
    """FLOP floors of one teacher-forced forward and of its backward (activation gradients through
    every matrix, weight gradients for the trained ones: all of them, or LoRA's adapters)."""
    enc, dec, head = seq2seq_parts(model)
    p_enc, p_dec = linear_params(enc), linear_params(dec) + linear_params(head)
    t_enc = linear_params(enc, trained_only=True)
    t_dec = linear_params(dec, trained_only=True) + linear_params(head, trained_only=True)
    forward = 2.0 * (p_enc * enc_tokens + p_dec * dec_tokens)
    return forward, forward + 2.0 * (t_enc * enc_tokens + t_dec * dec_tokens)


def generation_flops(model, src_tokens: int, new_tokens: int) -> float:
    enc, dec, head = seq2seq_parts(model)
    return float(2 * (linear_params(enc) * src_tokens + (linear_params(dec) + linear_params(head)) * new_tokens))


def encoder_flops(encoder: torch.nn.Module, tokens: int) -> tuple[float, float]:
    """An XLM-R encoder's forward and backward floors; its trained matrices are those requiring grad."""
    forward = 2.0 * linear_params(encoder) * tokens
    return forward, forward + 2.0 * linear_params(encoder, trained_only=True) * tokens


class PhaseTimer:
    """Charges wrapped calls to phases (exclusive time) and sums their FLOP floors, step by step."""

    def __init__(self) -> None:
        self._stack: list[list] = []  # [phase, start, seconds of nested phases]
        self._seconds: dict[str, float] = defaultdict(float)
        self._flops: dict[str, float] = defaultdict(float)
        self._undo: list[tuple] = []
        self.steps: list[dict] = []  # per step: {"seconds": {phase: s}, "flops": {phase: n}, "total": s}
        self.before_step = None  # called with the step's index before each step
        self.after_step = None  # returns a dict of extra numbers for the step's record (e.g. memory)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Yields whether the call is charged to ``name``: inside generation everything is sampling."""
        if any(frame[0] == "sampling" for frame in self._stack):
            yield False
            return
        frame = [name, time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield True
        finally:
            self._stack.pop()
            elapsed = time.perf_counter() - frame[1]
            self._seconds[name] += elapsed - frame[2]
            if self._stack:
                self._stack[-1][2] += elapsed

    def add_flops(self, name: str, flops: float) -> None:
        self._flops[name] += flops

    def wrap(self, owner, attr: str, phase: str, flops=None) -> None:
        """Replace ``owner.attr`` by a timed call charged to ``phase``; ``flops(args, kwargs, out)``
        returns the call's FLOP floor."""
        original = getattr(owner, attr)

        # wraps: transformers' generate checks its keyword arguments against the signature of the
        # model's forward (through __wrapped__), e.g. encoder_outputs.
        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(phase) as charged:
                out = original(*args, **kwargs)
                if charged and flops is not None:
                    self._flops[phase] += flops(args, kwargs, out)
            return out

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, original))

    def wrap_step(self, owner, attr: str) -> None:
        """The step function itself: its own time is "other"; each call closes one step's record."""
        original = getattr(owner, attr)

        @functools.wraps(original)
        def step(*args, **kwargs):
            if self.before_step is not None:
                self.before_step(len(self.steps))
            start = time.perf_counter()
            with self.phase("other"):
                out = original(*args, **kwargs)
            record = {"seconds": dict(self._seconds), "flops": dict(self._flops), "total": time.perf_counter() - start}
            self.steps.append(record | (self.after_step() if self.after_step is not None else {}))
            self._seconds.clear()
            self._flops.clear()
            return out

        setattr(owner, attr, step)
        self._undo.append((owner, attr, original))

    def restore(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def summary(self, skip: int = 1) -> dict:
        """Mean per step over the steps after the first ``skip`` (warm-up: allocation, first calls)."""
        steps = self.steps[skip:] or self.steps
        n = max(len(steps), 1)
        seconds = {p: sum(s["seconds"].get(p, 0.0) for s in steps) / n for p in PHASES}
        flops = {p: sum(s["flops"].get(p, 0.0) for s in steps) / n for p in PHASES}
        return {"steps": len(steps), "total": sum(s["total"] for s in steps) / n, "seconds": seconds, "flops": flops,
                "peak_rss": max((s.get("peak_rss", 0) for s in steps), default=0)}


def reset_peak_rss() -> None:
    """Start the process's resident-memory high-water mark afresh (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def peak_rss() -> int:
    """The process's resident-memory high-water mark in bytes (VmHWM; 0 where /proc has none)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return 0


def instrument(timer: PhaseTimer) -> None:
    """Wrap the step's heavy functions (see the module docstring) for the run that follows."""
    from transformers import M2M100ForConditionalGeneration, MBartForConditionalGeneration, XLMRobertaModel


    def arg(args, kwargs, i, name):
        return args[i] if len(args) > i else kwargs.get(name)

    def with_backward(out_tensor, forward: float, backward: float) -> float:
        """A forward whose output needs a gradient will be backpropagated: its floor goes to backward."""
        if torch.is_grad_enabled() and out_tensor.requires_grad:
            timer.add_flops("backward", backward)
        return forward

    def replay_flops(args, kwargs, out):
        model = args[0]
        mask, ids = arg(args, kwargs, 2, "attention_mask"), arg(args, kwargs, 1, "input_ids")
        enc = int(mask.sum()) if mask is not None else ids.numel()
        dec_ids, labels = kwargs.get("decoder_input_ids"), kwargs.get("labels")
        dec = int((dec_ids != model.config.pad_token_id).sum()) if dec_ids is not None else int((labels != -100).sum())
        return with_backward(out.logits, *translator_flops(model, enc, dec))

    def sampling_flops(args, kwargs, out):
        translator, mask = args[0], arg(args, kwargs, 2, "attention_mask")
        new = int((out[:, 1:] != translator.tokenizer.pad_token_id).sum())
        return generation_flops(translator.model, int(mask.sum()), new)

    def qe_flops(args, kwargs, out):
        mask = kwargs.get("attention_mask")
        hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
        return with_backward(hidden, *encoder_flops(args[0], int(mask.sum())))

    def packed_flops(args, kwargs, out):
        return with_backward(out, *encoder_flops(args[0].encoder.model, int(args[2].sum())))

    def bridge_flops(args, kwargs, out):
        # [U, V_nmt] @ table [V_nmt, H] over the U distinct translator steps the QE sees; the
        # straight-through relaxations need it in the backward pass only.
        # The logits may be [B, T, V] or packed [N, V]: the steps come from forward_ids [B, T].
        qe_embeddings, logits, forward_ids, alignment, length = args[1], args[2], args[3], args[4], args[5]
        relaxation = args[6] if len(args) > 6 else kwargs.get("relaxation", "st")
        rows, _, nmt_pos, _ = alignment.entries(length)
        seen = torch.unique(rows * forward_ids.shape[1] + nmt_pos).numel()
        product = 2.0 * seen * logits.shape[-1] * qe_embeddings.shape[1]
        return with_backward(out, product if relaxation == "softmax" else 0.0, product)

    timer.wrap_step(qeebm.training.loop, "train_step")
    timer.wrap(Translator, "generate_ids", "sampling", sampling_flops)
    for cls in (M2M100ForConditionalGeneration, MBartForConditionalGeneration):
        timer.wrap(cls, "forward", "replay", replay_flops)
    timer.wrap(XLMRobertaModel, "forward", "qe forward", qe_flops)
    timer.wrap(qeebm.qe.scoring, "packed_scores", "qe forward", packed_flops)
    timer.wrap(qeebm.qe.energy, "packed_scores", "qe forward", packed_flops)
    timer.wrap(KiwiEnergy, "_relax", "relax+bridge")
    timer.wrap(Bridge, "shift", "relax+bridge", bridge_flops)
    timer.wrap(Bridge, "align", "alignment")
    timer.wrap(torch.autograd, "backward", "backward")
    timer.wrap(torch.autograd, "grad", "backward")
    timer.wrap(torch.optim.AdamW, "step", "optimiser")
