"""Decoding a corpus and scoring it: sacrebleu BLEU and chrF++, teacher-forced NLL.

Each function takes an optional accelerator: with several processes the corpus is split into
contiguous shards, one per process, and the results are gathered so every process returns the same
full answer (in corpus order).
"""

from __future__ import annotations

import json
from pathlib import Path

import sacrebleu
import torch
import torch.nn.functional as F
from accelerate.utils import gather_object

from qeebm.config import GenerationConfig
from qeebm.errors import QeebmError


def corpus_metrics(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu's default 13a tokenisation) and chrF++ (chrF with word bigrams)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    bleu = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs]).score
    chrf = sacrebleu.metrics.CHRF(word_order=2).corpus_score(hyps, [refs]).score
    return {"bleu": float(bleu), "chrf": float(chrf)}


def _shard(items: list, accelerator) -> list:
    if accelerator is None or accelerator.num_processes == 1:
        return list(items)
    with accelerator.split_between_processes(list(items)) as part:
        return list(part)


def translate_corpus(translator, src: list[str], gen: GenerationConfig, accelerator=None) -> list[str]:
    """Hypotheses for ``src`` in order; decoding is split across processes when there are several."""
    part = _shard(src, accelerator)
    hyps = translator.generate(part, gen) if part else []
    if accelerator is None or accelerator.num_processes == 1:
        return hyps
    return gather_object(hyps)


@torch.no_grad()
def corpus_nll(translator, src: list[str], tgt: list[str], batch_size: int, accelerator=None) -> float:
    """Teacher-forced negative log-likelihood per target token over the whole corpus (no label
    smoothing), computed with ``translator.model`` as it is (the caller picks train/eval mode)."""
    idx = _shard(list(range(len(src))), accelerator)
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


def sacrebleu_scores(hyps: list[str], refs: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """BLEU, chrF++ and TER as the sacrebleu command line computes them, with their signatures."""
    if len(hyps) != len(refs):
        raise QeebmError(f"{len(hyps)} hypotheses for {len(refs)} references: the counts must match")
    metrics = {
        "bleu": sacrebleu.metrics.BLEU(),
        "chrf": sacrebleu.metrics.CHRF(word_order=2),
        "ter": sacrebleu.metrics.TER(),
    }
    scores, signatures = {}, {}
    for name, metric in metrics.items():
        scores[name] = float(metric.corpus_score(hyps, [refs]).score)
        signatures[name] = str(metric.get_signature())
    return scores, signatures


def evaluate_main(args) -> dict:
    """``qeebm evaluate``: translate (or read) the test set's hypotheses and report sacrebleu scores."""
    from qeebm.config import CorpusConfig, ModelConfig
    from qeebm.data import read_corpus
    from qeebm.translator import Translator

    test = read_corpus(CorpusConfig(path=args.test), "test", need_target=True)
    decoding: dict = {}
    if args.hyps:
        path = Path(args.hyps)
        if not path.is_file():
            raise QeebmError(f"hypothesis file not found: {path}")
        hyps = path.read_text(encoding="utf-8").split("\n")
        if hyps and hyps[-1] == "":
            hyps.pop()
        if len(hyps) != len(test.src):
            raise QeebmError(f"{path} has {len(hyps)} lines but {args.test} has {len(test.src)} segments")
    elif args.model:
        translator = Translator.load(ModelConfig(name_or_path=args.model, src_lang=args.src_lang, tgt_lang=args.tgt_lang))
        gen = GenerationConfig(num_beams=args.beams, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
        hyps = translate_corpus(translator, test.src, gen)
        decoding = {"num_beams": gen.num_beams, "max_new_tokens": gen.max_new_tokens}
    else:
        raise QeebmError("qeebm evaluate needs --model or --hyps")
    scores, signatures = sacrebleu_scores(hyps, test.tgt)
    report = {
        "model": args.model,
        "test": args.test,
        "segments": len(hyps),
        "decoding": decoding,
        "corpus": scores,
        "signatures": signatures,
    }
    print(json.dumps({"corpus": scores, "signatures": signatures}, indent=2))
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        out.write_text(json.dumps(report | {"hyps": hyps}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report
