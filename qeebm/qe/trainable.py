"""The parts of a COMET-family QE that QE-dynamic trains, and its score with gradients into them.

QE-dynamic (docs/method.md) updates a few parts of the QE it trains against: the estimator head, the
layer-wise attention, LoRA adapters on the encoder (the reference code used a bottleneck adapter).
This module is where those parts are named and where comet's own forward is called with gradients,
so the training method never reaches into comet's internals.
"""

from __future__ import annotations

import torch

from qeebm.errors import QeebmError

PARTS = ("head", "layerwise", "lora")


def trainable_parts(qe, parts, *, lora_r: int = 8, lora_alpha: int = 16, lora_targets=("query", "value"),
                    seed: int = 0) -> dict[str, torch.nn.Parameter]:
    """Freeze ``qe``, add LoRA adapters to its encoder when ``parts`` has "lora", and return the
    parameters of ``parts`` (any of PARTS) by name, left with ``requires_grad=False``: the caller
    switches them on for its own update only."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise QeebmError(f"unknown QE parts {unknown}; choose from {', '.join(PARTS)}")
    qe.requires_grad_(False)
    chosen: list[torch.nn.Parameter] = []
    if "head" in parts:
        chosen += list(qe.estimator.parameters())
    if "layerwise" in parts:
        if qe.layerwise_attention is None:
            raise QeebmError("qe.train_parts has 'layerwise', but this QE has no layer-wise attention")
        chosen += list(qe.layerwise_attention.parameters())
    if "lora" in parts:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=list(lora_targets),
                            bias="none")
        # A fixed seed, not the run's RNG: every process must draw the same adapters.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            qe.encoder.model = get_peft_model(qe.encoder.model, config)
        chosen += [p for n, p in qe.encoder.model.named_parameters() if "lora_" in n]
    wanted = {id(p) for p in chosen}
    params = {n: p for n, p in qe.named_parameters() if id(p) in wanted}
    for p in params.values():
        p.requires_grad_(False)
    return params


def scores(qe, src: list[str], mt: list[str], device) -> torch.Tensor:
    """``[B]`` reference-free scores of (src, mt) pairs through comet's own forward, differentiable
    in whichever QE parameters require grad."""
    (inputs,) = qe.prepare_sample([{"src": s, "mt": m} for s, m in zip(src, mt)], stage="predict")
    return qe.forward(input_ids=inputs["input_ids"].to(device),
                      attention_mask=inputs["attention_mask"].to(device)).score.view(-1)
