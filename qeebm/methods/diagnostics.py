"""Gradient diagnostics: how hard each part of a loss pulls on the model, and in which direction.

A method's loss is a weighted sum of terms (``StepOutput.terms``: CE and energy for QE-EBM, CE and
the policy gradient for REINFORCE, ...). Their weights only mean something next to the size of each
term's gradient: at the published QE-EBM beta the energy's gradient was about a millionth of the
CE's in the tiny world, so the method was SFT to six digits. ``term_gradient_stats`` measures each
term's gradient over the trainable parameters without touching ``.grad``, so the step's own
backward pass is unaffected.
"""

from __future__ import annotations

import math

import torch

REFERENCE_TERM = "ce"


def term_gradient_stats(terms: dict[str, torch.Tensor], params: list[torch.nn.Parameter],
                        reference: str = REFERENCE_TERM) -> dict[str, float]:
    """Norms of each term's gradient over ``params``, and each term's norm ratio and cosine against
    the ``reference`` term when there is one.

    Returns ``grad_<name>`` (the norm of each term's gradient), and for every term but the
    reference ``ratio_<name>`` (its norm / the reference's) and ``cos_<name>`` (the cosine). The
    graph of every term is kept (``retain_graph``), so the caller can still backpropagate the loss.
    Only two gradients are alive at a time: the reference's and the current term's."""
    params = [p for p in params if p.requires_grad]
    if not terms or not params:
        return {}
    ref_grad = _gradient(terms[reference], params) if reference in terms else None
    norms = {reference: grad_norm(ref_grad)} if ref_grad is not None else {}
    dots = {}
    for name, term in terms.items():
        if name == reference:
            continue
        grad = _gradient(term, params)
        norms[name] = grad_norm(grad)
        if ref_grad is not None:
            dots[name] = grad_dot(grad, ref_grad)
        del grad
    return gradient_stats(norms, dots, reference)


def gradient_stats(norms: dict[str, float], dots: dict[str, float], reference: str = REFERENCE_TERM) -> dict[str, float]:
    """``term_gradient_stats``'s numbers from the terms' gradient norms and each term's dot product
    with the reference's gradient (absent without a reference term): for a method that measured its
    terms' gradients anyway (QE-EBM's relative weighting)."""
    out = {f"grad_{name}": norm for name, norm in norms.items()}
    ref_norm = norms.get(reference)
    for name, dot in dots.items():
        norm = norms[name]
        out[f"ratio_{name}"] = norm / ref_norm if ref_norm > 0 else math.inf
        out[f"cos_{name}"] = dot / (norm * ref_norm) if norm > 0 and ref_norm > 0 else 0.0
    return out


def term_gradients(terms: dict[str, torch.Tensor], params: list[torch.nn.Parameter]) -> dict[str, list[torch.Tensor]]:
    """Each term's gradient over ``params`` (zeros where a term does not reach a parameter), graphs kept."""
    return {name: _gradient(term, params) for name, term in terms.items()}


class _KnownGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value, grads, *params):
        ctx.grads = grads
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return (None, None, *(g * grad_output for g in ctx.grads))


def with_known_gradient(value: torch.Tensor, params: list[torch.nn.Parameter], grads: list[torch.Tensor]) -> torch.Tensor:
    """A scalar loss equal to ``value`` whose gradient in ``params`` is ``grads`` (times whatever
    backward seeds it with: accelerate's loss scale, the loop's process count).

    When a step has already computed its terms' gradients (relative weighting measures them to set
    the energy's weight), its backward hands them over instead of traversing the graph a second
    time: through a CometKiwi-sized QE that second pass was a third of a QE-EBM step."""
    return _KnownGradient.apply(value.detach(), list(grads), *params)


def _gradient(term: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    if not term.requires_grad:
        return [torch.zeros_like(p) for p in params]
    grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def grad_norm(grads: list[torch.Tensor]) -> float:
    """The Euclidean norm of a gradient given as one tensor per parameter, summed in float64."""
    return math.sqrt(grad_dot(grads, grads))


def grad_dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The dot product of two gradients given as one tensor per parameter, summed in float64."""
    return sum(float(torch.sum(x.double() * y.double())) for x, y in zip(a, b))
