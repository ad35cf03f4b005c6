"""Does the straight-through gradient point where the expected QE score goes?

QE-EBM follows the gradient of a relaxed energy: the QE's score of a sampled translation, with the
one-hot tokens replaced in the backward pass by the translator's softmax (straight-through), by the
expected embedding (softmax) or by a Gumbel-perturbed softmax. None of these is the gradient of what
training is meant to raise, the expected score ``J(theta) = E_{y ~ p_theta(.|x)} Q(x, y)``. The
score-function identity gives that gradient without bias:

    grad J = E_y[(Q(x, y) - b) grad log p_theta(y | x)],

``b`` any baseline independent of ``y`` (here leave-one-out over the samples of the same source,
which keeps the estimate unbiased). With many samples it is the reference the relaxed gradients are
measured against. Both are estimated from independent halves of the samples, so the noise of each
estimate is measured too: ``agreement`` reports the cosine between a relaxed gradient and the
score-function gradient on independent halves, each estimate's split-half cosine (its own
reproducibility at that many samples), and their ratio, the cosine corrected for the noise of both
(``cos(A1, B2) / sqrt(cos(A1, A2) cos(B1, B2))``, an estimate of the cosine of the two expectations).

Every forward pass runs in eval mode (no dropout), so ``p_theta`` is one well-defined distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qeebm.config import GenerationConfig
from qeebm.methods.control_variate import control_terms, leave_one_out, surrogate
from qeebm.methods.rl import policy_logits, sequence_logprobs
from qeebm.methods.sampling import Samples, action_mask, sample
from qeebm.translation.translator import eval_mode, output_rows


@dataclass
class Draws:
    """``n`` samples of each source, split into two independent halves (``half`` [B], 0 or 1, the
    samples of one source alternating), with their exact QE ``scores`` [B] and the references of
    their rows (or None)."""

    samples: object  # methods.sampling.Samples
    scores: torch.Tensor
    half: torch.Tensor
    n: int
    refs: list[str] | None


@torch.no_grad()
def draw(translator, energy, src: list[str], n: int, max_new_tokens: int = 50, refs: list[str] | None = None,
         chunk: int = 64) -> Draws:
    """``n`` (even) ancestral samples of each source from the translator in eval mode (``chunk`` per
    source at a time), scored by the energy's QE (against ``refs`` for a reference-based one). Rows
    are source-major: the ``n`` samples of ``src[i]`` are rows ``i * n`` to ``(i + 1) * n - 1``."""
    if n < 4 or n % 2:
        raise ValueError(f"n must be an even number >= 4, got {n}")
    gen = GenerationConfig(num_beams=1, do_sample=True, max_new_tokens=max_new_tokens)
    pad = translator.tokenizer.pad_token_id
    blocks: list[list[torch.Tensor]] = [[] for _ in src]  # per source, its sequences chunk by chunk
    enc = None
    with eval_mode(translator.model):
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            s = sample(translator, src, k, gen, decode=False)
            enc = s
            for i in range(len(src)):
                blocks[i].append(s.sequences[i * k:(i + 1) * k])
    width = max(b.shape[1] for per in blocks for b in per)
    sequences = torch.cat([torch.nn.functional.pad(b, (0, width - b.shape[1]), value=pad)
                           for per in blocks for b in per])  # [len(src) * n, width]
    samples = Samples(src=[x for x in src for _ in range(n)], hyps=None,
                      input_ids=enc.input_ids[::enc.input_ids.shape[0] // len(src)].repeat_interleave(n, dim=0),
                      attention_mask=enc.attention_mask[::enc.attention_mask.shape[0] // len(src)].repeat_interleave(n, dim=0),
                      sequences=sequences, mask=action_mask(translator, sequences, max_new_tokens),
                      temperature=1.0, suppress=enc.suppress)
    rows_ref = [r for r in refs for _ in range(n)] if refs is not None else None
    mt_mask = translator.teacher_forcing(sequences)["labels"] != -100
    scores = energy.score_ids(samples.src, sequences[:, 1:], mt_mask, ref=rows_ref)
    half = torch.arange(n).remainder(2).repeat(len(src))
    return Draws(samples=samples, scores=scores, half=half, n=n, refs=rows_ref)


def _flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def score_function_gradient(translator, d: Draws, which: int, chunk: int = 128) -> torch.Tensor:
    """Unbiased estimate of ``grad sum_x E_y Q(x, y)`` from half ``which`` of the draws: the mean over
    a source's samples of ``(Q - b) grad log p(y|x)``, ``b`` the mean of the source's other samples
    in the same half (leave-one-out)."""
    model = translator.model
    params = [p for p in model.parameters() if p.requires_grad]
    rows = (d.half == which).nonzero().squeeze(1)
    m = d.n // 2
    q = d.scores[rows].view(-1, m).double()
    adv = (q - (q.sum(1, keepdim=True) - q) / (m - 1)).reshape(-1).float()  # [rows]
    s = d.samples
    total = torch.zeros(sum(p.numel() for p in params))
    with eval_mode(model):
        for start in range(0, len(rows), chunk):
            idx = rows[start:start + chunk]
            seq = s.sequences[idx]
            logits = model(input_ids=s.input_ids[idx], attention_mask=s.attention_mask[idx],
                           decoder_input_ids=seq[:, :-1], use_cache=False).logits
            _, logp = sequence_logprobs(policy_logits(logits, 1.0, s.suppress), seq[:, 1:], s.mask[idx])
            total += _flat_grad((adv[start:start + chunk] * logp).sum() / m, params)
    return total


def relaxed_gradient(translator, energy, d: Draws, which: int, relaxation: str, tau: float = 1.0,
                     chunk: int = 128, generator: torch.Generator | None = None) -> torch.Tensor:
    """What QE-EBM follows, from half ``which`` of the draws: the mean over a source's samples of the
    gradient of the relaxed score (minus the energy) through the teacher-forced replay."""
    model = translator.model
    params = [p for p in model.parameters() if p.requires_grad]
    rows = (d.half == which).nonzero().squeeze(1)
    m = d.n // 2
    s = d.samples
    total = torch.zeros(sum(p.numel() for p in params))
    mt_mask_all = translator.teacher_forcing(s.sequences)["labels"] != -100
    with eval_mode(model):
        for start in range(0, len(rows), chunk):
            idx = rows[start:start + chunk]
            seq, mt_ids, mt_mask = s.sequences[idx], s.sequences[idx, 1:], mt_mask_all[idx]
            content = energy.bridge.content_mask(mt_ids, mt_mask)
            with output_rows(model, content):
                logits = model(input_ids=s.input_ids[idx], attention_mask=s.attention_mask[idx],
                               decoder_input_ids=seq[:, :-1], use_cache=False).logits
            refs = [d.refs[i] for i in idx.tolist()] if d.refs is not None else None
            e = energy([s.src[i] for i in idx.tolist()], mt_ids, mt_mask, logits.float(), relaxation=relaxation,
                       tau=tau, generator=generator, ref=refs)
            total += _flat_grad(-e.sum() / m, params)
    return total


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = a.norm() * b.norm()
    return float(a @ b / den) if den > 0 else float("nan")


def agreement(relaxed: tuple[torch.Tensor, torch.Tensor], unbiased: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """How far a relaxed gradient (estimated on two independent halves) points where the unbiased one
    does: the cross-half cosines (independent noise), each estimate's split-half cosine, and the
    cross cosine corrected for both noises (NaN when a split-half cosine is not positive)."""
    r1, r2 = relaxed
    u1, u2 = unbiased
    cross = (cosine(r1, u2) + cosine(r2, u1)) / 2
    rel_r, rel_u = cosine(r1, r2), cosine(u1, u2)
    corrected = cross / math.sqrt(rel_r * rel_u) if rel_r > 0 and rel_u > 0 else float("nan")
    return {"cosine": cross, "relaxed_split_half": rel_r, "unbiased_split_half": rel_u, "corrected": corrected,
            "norm_ratio": float((r1.norm() + r2.norm()) / (u1.norm() + u2.norm()))}


# ------------------------------------------------------------------- estimators at equal compute
#: QE passes one K-sample estimate spends per source, as the training step spends them:
#: (forward passes, backward passes to the QE's inputs), each times K. The relaxations whose forward
#: value is not the text's score (softmax, gumbel-st) also score the text for the step's metrics.
QE_PASSES = {"reinforce": (1, 0), "st": (1, 1), "reinmax": (1, 1), "softmax": (2, 1), "gumbel-st": (2, 1),
             "loo-cv": (1, 1)}


def qe_cost(estimator: str, k: int, backward_cost: float = 2.0) -> float:
    """QE forward-pass equivalents per source of one K-sample estimate (a backward pass counted as
    ``backward_cost`` forwards)."""
    fwd, bwd = QE_PASSES[estimator]
    return k * (fwd + backward_cost * bwd)


def group_rows(d: Draws, k: int, group: int) -> torch.Tensor:
    """The rows of group ``group`` of size ``k``: samples ``group * k`` to ``group * k + k - 1`` of
    every source, a source's rows adjacent."""
    n_src = len(d.samples.src) // d.n
    start = group * k
    if start + k > d.n:
        raise ValueError(f"group {group} of {k} needs {start + k} samples per source; there are {d.n}")
    return (torch.arange(n_src)[:, None] * d.n + torch.arange(start, start + k)[None, :]).reshape(-1)


def _replay(translator, d: Draws, rows: torch.Tensor):
    """The rows' sequences, emitted tokens, QE mask, sources and references."""
    s = d.samples
    seq = s.sequences[rows]
    mt_mask = translator.teacher_forcing(seq)["labels"] != -100
    refs = [d.refs[i] for i in rows.tolist()] if d.refs is not None else None
    return seq, seq[:, 1:], mt_mask, [s.src[i] for i in rows.tolist()], refs


def _score_function(translator, energy, d: Draws, rows: torch.Tensor, k: int, eta: float | None):
    """The leave-one-out score-function surrogate of the rows as the training step forms it: plain
    (``eta`` None: REINFORCE-LOO, a scalar) or with the QE-gradient control variate at weight ``eta``
    (a ``control_variate.Surrogate``)."""
    s = d.samples
    seq, mt_ids, mt_mask, src, refs = _replay(translator, d, rows)
    with eval_mode(translator.model) as model:
        logits = policy_logits(model(input_ids=s.input_ids[rows], attention_mask=s.attention_mask[rows],
                                     decoder_input_ids=seq[:, :-1], use_cache=False).logits, 1.0, s.suppress)
    logp, _ = sequence_logprobs(logits, mt_ids, s.mask[rows])  # [R, T]
    f = d.scores[rows].double()
    if eta is None:
        return ((f - leave_one_out(f, k)).to(logp.dtype)[:, None] * logp).sum()
    content = energy.bridge.content_mask(mt_ids, mt_mask) & s.mask[rows].bool()
    _, grads = energy.token_gradients(src, mt_ids, mt_mask, ref=refs)
    with torch.no_grad():
        table = energy.bridge_table()
    expected, taken = control_terms(logits, mt_ids, content, leave_one_out(grads, k), table)
    return surrogate(logp, s.mask[rows].bool(), expected, taken, content, f, k, eta)


def estimate(translator, energy, d: Draws, rows: torch.Tensor, k: int, estimator: str, eta: float = 1.0,
             tau: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """One estimate of ``grad sum_x E_y Q(x, y)`` from ``rows`` (K samples of each source, adjacent),
    as the training step would form it: the mean over a source's K samples of a relaxation's
    gradient (st, softmax, gumbel-st, reinmax), of the leave-one-out score function ("reinforce"),
    or of the control-variate estimator ("loo-cv", at weight ``eta``)."""
    model = translator.model
    params = [p for p in model.parameters() if p.requires_grad]
    if estimator == "reinforce":
        value = _score_function(translator, energy, d, rows, k, None)
    elif estimator == "loo-cv":
        value = _score_function(translator, energy, d, rows, k, eta).value
    else:
        s = d.samples
        seq, mt_ids, mt_mask, src, refs = _replay(translator, d, rows)
        content = energy.bridge.content_mask(mt_ids, mt_mask)
        with eval_mode(model), output_rows(model, content):
            logits = model(input_ids=s.input_ids[rows], attention_mask=s.attention_mask[rows],
                           decoder_input_ids=seq[:, :-1], use_cache=False).logits
        value = -energy(src, mt_ids, mt_mask, logits.float(), relaxation=estimator, tau=tau, generator=generator,
                        ref=refs).sum()
    return _flat_grad(value / k, params)


def cv_weight(translator, energy, d: Draws, rows: torch.Tensor, k: int) -> float:
    """The control-variate weight the training step would fit on these rows (sum a s / sum s^2)."""
    with torch.no_grad():
        a_s, s_s, _ = _score_function(translator, energy, d, rows, k, 0.0).sums.tolist()
    return a_s / s_s if s_s > 0 else 0.0


def signal_to_noise(estimates: torch.Tensor, unbiased: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """Of G independent estimates ``[G, P]`` of one gradient, against the unbiased many-sample
    estimate on two halves (``unbiased``):

    * ``snr``: a single estimate's signal-to-noise ratio, |E g|^2 / E|g - E g|^2 (|E g|^2 estimated
      without the noise's bias): how many estimates it takes to see the estimator's own direction;
    * ``corrected``: the noise-corrected cosine between the estimator's expectation and the true
      gradient (``agreement`` of the means of the two halves of the estimates): its bias;
    * ``single_cosine``: the mean cosine between ONE estimate and the true gradient, bias and noise
      together (the truth's own noise divided out: the mean of two halves whose split-half cosine
      is r points at the truth with cosine sqrt(2r / (1 + r))). This is what an update made from
      one estimate gets right, the number to compare at equal compute."""
    g = estimates.double()
    n = g.shape[0]
    mean = g.mean(0)
    noise = ((g - mean) ** 2).sum().item() / (n - 1)  # E|g - E g|^2
    signal = max(mean.pow(2).sum().item() - noise / n, 0.0)
    u1, u2 = (u.double() for u in unbiased)
    r = cosine(u1, u2)
    scale = math.sqrt(2 * r / (1 + r)) if r > 0 else float("nan")
    cosines = torch.nn.functional.cosine_similarity(g, ((u1 + u2) / 2)[None, :], dim=1) / scale
    half = n // 2
    return {"snr": signal / noise if noise > 0 else float("inf"),
            "corrected": agreement((g[:half].mean(0), g[half:].mean(0)), (u1, u2))["corrected"],
            "single_cosine": cosines.mean().item(), "single_cosine_se": cosines.std().item() / math.sqrt(n)}
