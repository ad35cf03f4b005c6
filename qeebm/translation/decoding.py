"""Decoding a corpus and its teacher-forced NLL, split across processes when there are several.

With an accelerator of several processes the corpus is split into contiguous shards, one per
process, and the results are gathered so every process returns the same full answer, in corpus
order. The training loop's validation and the evaluation report both decode through here.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object

from qeebm.config import GenerationConfig


def shard(items: list, accelerator) -> list:
    if accelerator is None or accelerator.num_processes == 1:
        return list(items)
    with accelerator.split_between_processes(list(items)) as part:
        return list(part)


def translate_corpus(translator, src: list[str], gen: GenerationConfig, accelerator=None) -> list[str]:
    """Hypotheses for ``src`` in order; decoding is split across processes when there are several."""
    part = shard(src, accelerator)
    hyps = translator.generate(part, gen) if part else []
    if accelerator is None or accelerator.num_processes == 1:
        return hyps
    return gather_object(hyps)


@torch.no_grad()
def corpus_nll(translator, src: list[str], tgt: list[str], batch_size: int, accelerator=None) -> float:
    """Teacher-forced negative log-likelihood per target token over the whole corpus (no label
    smoothing), computed with ``translator.model`` as it is (the caller picks train/eval mode)."""
    idx = shard(list(range(len(src))), accelerator)
    device = next(translator.model.parameters()).device
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed NLL, token count
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        enc = translator.encode([src[i] for i in chunk], [tgt[i] for i in chunk])
        enc = {k: v.to(device) for k, v in enc.items()}
        logits = translator.model(**enc).logits.float()
        labels = enc["labels"]
        total[0] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum").double()
        total[1] += (labels != -100).sum()
    if accelerator is not None and accelerator.num_processes > 1:
        total = accelerator.reduce(total, "sum")
    return (total[0] / total[1].clamp(min=1)).item()


def decode_test(translator, src: Sequence[str], gen: GenerationConfig) -> list[str]:
    """Hypotheses as one line each: the report's text is then exactly what a ``.hyp.txt`` beside it
    holds, and rescoring that file with sacrebleu or comet-score reproduces the report."""
    return [" ".join(h.split()) for h in translate_corpus(translator, list(src), gen)]
