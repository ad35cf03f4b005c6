"""Regression training of a COMET-family QE on (src, mt[, ref], score): comet's objective in a plain
torch loop (no Lightning Trainer).

Objective as in comet's `training_step`: MSE between the predicted and the target score; a
UnifiedMetric fed a reference (XCOMET) sums the MSE of its [mt, src], [mt, ref] and [mt, src, ref]
passes. Modes:

* "head": the estimator and the layer-wise attention (comet's "frozen encoder" phase);
* "full": also the encoder; its embeddings stay frozen when the model's hparams say
  keep_embeddings_frozen (true for every public COMET/CometKiwi checkpoint), as comet's
  `unfreeze_encoder` does. (`encoder.unfreeze()` alone would unfreeze them too.)
* "lora": head + peft LoRA adapters on the encoder's XLMRobertaModel; the adapters are merged back
  after training, so the result is a plain comet model that `save_qe` / `comet-score` read.

Every parameter's requires_grad flag is restored afterwards; the model is returned in eval mode.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

import torch

from qeebm.errors import QeebmError
from qeebm.qe.models import qe_kind, save_qe  # noqa: F401 - save_qe is part of this module's API
from qeebm.qe.scoring import pad_rows

log = logging.getLogger(__name__)

MODES = ("head", "full", "lora")


@contextmanager
def torch_threads(n: int | None):
    """torch's intra-op thread count set to n (when given) for a block, then restored."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def head_parameters(model) -> list[torch.nn.Parameter]:
    params = list(model.estimator.parameters())
    if model.layerwise_attention is not None:
        params += list(model.layerwise_attention.parameters())
    return params


def encoder_parameters(model, keep_embeddings_frozen: bool | None = None) -> list[torch.nn.Parameter]:
    if keep_embeddings_frozen is None:
        keep_embeddings_frozen = bool(model.hparams.get("keep_embeddings_frozen", True))
    frozen = {id(p) for p in model.encoder.model.embeddings.parameters()} if keep_embeddings_frozen else set()
    return [p for p in model.encoder.model.parameters() if id(p) not in frozen]


def _add_lora(model, r: int, targets) -> list[torch.nn.Parameter]:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=list(targets), bias="none")
    model.encoder.model = get_peft_model(model.encoder.model, config)
    return [p for n, p in model.encoder.model.named_parameters() if "lora_" in n]


def _merge_lora(model) -> None:
    model.encoder.model = model.encoder.model.merge_and_unload()


def _samples(src, mt, ref, scores) -> list[dict]:
    out = []
    for i, (s, m, y) in enumerate(zip(src, mt, scores)):
        d = {"src": s, "mt": m, "score": float(y)}
        if ref is not None:
            d["ref"] = ref[i]
        out.append(d)
    return out


def _unpad(ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [row[: int(n)].clone() for row, n in zip(ids, mask.sum(dim=1))]


def _tokenize(model, data: list[dict], chunk: int = 512) -> list[list[torch.Tensor]]:
    """Each example's model inputs as unpadded id rows, made once by comet's own prepare_sample
    (so truncation and segment order are comet's): for a UnifiedMetric one row per input combo
    ([mt, src] or the three XCOMET combos), for a RegressionMetric the src, mt and ref rows."""
    rows: list[list[torch.Tensor]] = []
    for start in range(0, len(data), chunk):
        inputs, _ = model.prepare_sample(data[start:start + chunk], stage="fit")
        if isinstance(inputs, tuple):
            cols = [_unpad(x["input_ids"], x["attention_mask"]) for x in inputs]
        else:
            cols = [_unpad(inputs[f"{k}_input_ids"], inputs[f"{k}_attention_mask"])
                    for k in ("src", "mt", "ref")]
        rows += [list(r) for r in zip(*cols)]
    return rows


def _batches(rows, batch_size: int, gen: torch.Generator, groups: list[int] | None = None) -> list[list[int]]:
    """Shuffled batches of similar length: shuffle, sort within windows of 32 batches, shuffle the
    batches (less padding, still a random order every epoch).

    groups (reference-based COMET): the rows of one group (same src and ref) are shuffled as a
    block and kept adjacent, so a batch holds several candidates of few sources and `_loss` can
    encode each src and ref once.
    """
    if groups is None:
        order = torch.randperm(len(rows), generator=gen).tolist()
        key = lambda i: sum(len(r) for r in rows[i])  # noqa: E731
    else:
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        blocks = list(members.values())
        order = [i for b in torch.randperm(len(blocks), generator=gen).tolist() for i in blocks[b]]
        key = lambda i: (len(rows[i][0]) + len(rows[i][2]), groups[i], len(rows[i][1]))  # noqa: E731
    window = 32 * batch_size
    batches = []
    for start in range(0, len(order), window):
        part = sorted(order[start:start + window], key=key)
        batches += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


def _source_groups(rows) -> list[int]:
    ids: dict[tuple, int] = {}
    return [ids.setdefault((tuple(r[0].tolist()), tuple(r[2].tolist())), len(ids)) for r in rows]


def _pad(seqs: list[torch.Tensor], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``scoring.pad_rows`` on id tensors, with the integer mask comet's training step is given."""
    ids, mask = pad_rows([s.tolist() for s in seqs], pad_id, device)
    return ids, mask.long()


def _embed_unique(model, seqs: list[torch.Tensor], pad: int, device) -> torch.Tensor:
    """Sentence embeddings [B, H] of seqs, each distinct sequence encoded once (a batch holds
    several candidates of the same source and reference)."""
    index: dict[tuple, int] = {}
    where = [index.setdefault(tuple(x.tolist()), len(index)) for x in seqs]
    unique = [None] * len(index)
    for x, k in zip(seqs, where):
        unique[k] = x
    ids, mask = _pad(unique, pad, device)
    return model.get_sentence_embedding(ids, mask)[torch.tensor(where, device=device)]


def _loss(model, rows: list[list[torch.Tensor]], y: torch.Tensor) -> torch.Tensor:
    pad, device = model.encoder.tokenizer.pad_token_id, model.device
    y = y.to(device)
    if qe_kind(model) == "comet":
        # RegressionMetric.forward, with src and ref encoded once per distinct sentence
        src, mt, ref = ([r[j] for r in rows] for j in range(3))
        m_ids, m_mask = _pad(mt, pad, device)
        pred = model.estimate(_embed_unique(model, src, pad, device),
                              model.get_sentence_embedding(m_ids, m_mask),
                              _embed_unique(model, ref, pad, device))
        return torch.nn.functional.mse_loss(pred.score, y)
    cols = [_pad([r[j] for r in rows], pad, device) for j in range(len(rows[0]))]
    # comet's UnifiedMetric.training_step: the MSE of every input combo, summed
    return sum(torch.nn.functional.mse_loss(model.forward(input_ids=i, attention_mask=m).score, y)
               for i, m in cols)


def train_qe(model, src: list[str], mt: list[str], scores: list[float], *, ref: list[str] | None = None,
             mode: str = "head", epochs: int = 1, lr: float = 1e-4, encoder_lr: float | None = None,
             batch_size: int = 16, seed: int = 0, lora_r: int = 8, lora_targets=("query", "value"),
             max_grad_norm: float | None = 1.0, weight_decay: float = 0.0,
             num_threads: int | None = None, train_embeddings: bool | None = None,
             schedule: str = "constant", warmup: float = 0.05):
    """Fit `model` to `scores` in place (MSE, AdamW); returns it in eval mode.

    num_threads: torch intra-op threads for this call only (restored after). Small models train
    faster on one thread, and a second thread collapses (10x slower) when the cores are shared.
    train_embeddings: in "full" mode, also train the encoder's embeddings (default: not if the
    hparams say keep_embeddings_frozen). Encoders trained from scratch need it: frozen random
    embeddings cannot learn which pieces mean the same thing.
    schedule: "constant" (comet's default when warmup_steps is 0) or "linear": a linear warm-up over
    the first `warmup` fraction of the steps, then a linear decay to zero.
    """
    if schedule not in ("constant", "linear"):
        raise QeebmError(f"unknown schedule {schedule!r}: expected 'constant' or 'linear'")
    if mode not in MODES:
        raise QeebmError(f"unknown QE training mode {mode!r}: expected one of {MODES}")
    if not (len(src) == len(mt) == len(scores)) or (ref is not None and len(ref) != len(mt)):
        raise QeebmError("train_qe: src, mt, scores (and ref) must have the same length")
    if not src:
        raise QeebmError("train_qe: no training examples")
    kind = qe_kind(model)
    if kind == "comet" and ref is None:
        raise QeebmError("train_qe: a reference-based COMET needs ref")
    if kind == "kiwi":
        ref = None

    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    groups = [{"params": head_parameters(model), "lr": lr}]
    if mode == "full":
        keep = None if train_embeddings is None else not train_embeddings
        groups.append({"params": encoder_parameters(model, keep), "lr": encoder_lr or lr})
    elif mode == "lora":
        groups.append({"params": _add_lora(model, lora_r, lora_targets), "lr": encoder_lr or lr})
    trainable = [p for g in groups for p in g["params"]]
    for p in trainable:
        p.requires_grad_(True)

    rows = _tokenize(model, _samples(src, mt, ref, scores))
    targets = torch.tensor([float(v) for v in scores])
    same_source = _source_groups(rows) if kind == "comet" else None
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    total_steps = epochs * -(-len(rows) // batch_size)
    warm = max(1, int(warmup * total_steps))

    def factor(step: int) -> float:  # step counts from 0
        if schedule == "constant":
            return 1.0
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    try:
        # dropout draws: reproducible, and the caller's RNG untouched
        with torch.random.fork_rng(), torch_threads(num_threads):
            torch.manual_seed(seed)
            model.train()
            for epoch in range(epochs):
                total = 0.0
                for batch in _batches(rows, batch_size, gen, same_source):
                    loss = _loss(model, [rows[i] for i in batch], targets[batch])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if max_grad_norm:
                        torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
                    opt.step()
                    sched.step()
                    total += loss.item() * len(batch)
                log.info("train_qe %s epoch %d/%d: mse %.5f (%.1fs)", mode, epoch + 1, epochs,
                         total / len(rows), time.perf_counter() - start)
    finally:
        if mode == "lora":
            _merge_lora(model)
        for p in model.parameters():  # LoRA parameters are gone after the merge
            p.requires_grad_(flags.get(p, False))
        model.eval()
    return model
