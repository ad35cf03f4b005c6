"""Runs that optimise a QE and nothing else: how fast a method raises the QE's score, and what that
does to the translation on the way.

No supervised term, no guards: the question is what the QE rewards when nothing else holds the
translator back. ``scripts/mechanism.py`` runs every method this way from the tiny world's base
(docs/energy.md: the energy found length within 50 steps); ``qeebm qe-check --probe-steps N`` runs
energy-only QE-EBM on a pair's dev sources as a hackability probe (``hackability_probe``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from qeebm.errors import QeebmError

# Model directories a run writes; the probe needs only its log.
_MODEL_DIRS = ("best", "final", "checkpoints")


def qe_only_overrides(method: str, k: int) -> list[str]:
    """Config overrides that make ``method`` (qe-ebm, reinforce or ppo) optimise the QE alone: no CE
    term, no guards, the full weight on the QE from the first step, K pure ancestral samples."""
    sampling = [f"sampling.num_samples={k}", "sampling.temperature=1.0", "sampling.top_k=0", "sampling.top_p=1.0"]
    if method == "qe-ebm":
        own = ["alpha=0.0", "beta_max=1.0", "beta_ramp_steps=0", "weighting=absolute", "guards=false"]
    elif method == "reinforce":
        own = ["alpha=0.0", "beta=1.0", "guards=false"]
    elif method == "ppo":
        own = ["alpha=0.0", "guards=false"]
    else:
        raise QeebmError(f"no QE-only form of method '{method}': choose qe-ebm, reinforce or ppo")
    section = method.replace("-", "_")
    return [f"{section}.{o}" for o in own + sampling]


def start_metrics(cfg, device=None) -> dict[str, float]:
    """The validation metrics (``loop.validate``: dev BLEU, chrF++, loss and the QE metrics of
    ``cfg.eval``) of ``cfg.model`` before any training step: the common start of every curve."""
    from qeebm.data import read_corpus
    from qeebm.loop import ValidationScorers, validate
    from qeebm.translator import Translator

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    translator = Translator.load(cfg.model).to(device)
    translator.model.eval()
    dev = read_corpus(cfg.data.dev, "dev", need_target=True)
    result, _ = validate(cfg, translator, dev, None, ValidationScorers(cfg, device))
    return result


def probe_overrides(qe: str, translator: str, dev: str, src_lang: str, tgt_lang: str, run_dir: Path, *, steps: int,
                    sources: int, batch: int, k: int, lr: float, every: int, dev_examples: int, seed: int) -> list[str]:
    """Energy-only QE-EBM on the first ``sources`` dev sources, validated on the first
    ``dev_examples`` dev pairs (greedy) with the probed QE and chrF++."""
    return qe_only_overrides("qe-ebm", k) + [
        "method=qe-ebm",
        f"seed={seed}",
        f"model.name_or_path={translator}",
        f"model.src_lang={src_lang}",
        f"model.tgt_lang={tgt_lang}",
        f"qe.path={qe}",
        # The CE term is off: the labelled pairs only have to exist. Every split is the dev file.
        *[f"data.{split}.path={dev}" for split in ("train", "dev", "test", "mono")],
        f"data.mono.max_examples={sources}",
        f"data.train.max_examples={sources}",
        f"optim.lr={lr}",
        f"optim.max_steps={steps}",
        f"optim.batch_size={batch}",
        "optim.warmup_steps=0",
        "optim.scheduler=constant",
        f"eval.every={every}",
        f"eval.max_examples={dev_examples}",
        "eval.metric=kiwi",
        "generation.num_beams=1",
        f"output.run_dir={run_dir}",
        f"output.save_every={steps}",
        "output.keep_last=1",
        "logging.every=1",
        "logging.diagnostics=false",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def hackability_probe(qe: str, translator: str, dev: str, src_lang: str, tgt_lang: str, run_dir: str | Path, *,
                      steps: int, sources: int, batch: int = 16, k: int = 5, lr: float = 3e-4, validations: int = 4,
                      dev_examples: int = 100, seed: int = 42, device=None) -> dict:
    """A short energy-only QE-EBM run (``probe_overrides``) against ``qe``, a CometKiwi, in
    ``run_dir`` (replaced if it exists; its weights are removed afterwards): how far the QE's dev score rises, how far dev chrF++ falls
    and how the samples' length moves, in total and per 1,000 samples drawn."""
    from qeebm.config import load_config
    from qeebm.loop import train
    from qeebm.runlog import read_metrics

    if steps < 1:
        raise QeebmError(f"--probe-steps must be at least 1; got {steps}")
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    batch = max(1, min(batch, sources))
    every = max(1, steps // max(1, validations))
    cfg = load_config(overrides=probe_overrides(qe, translator, dev, src_lang, tgt_lang, run_dir, steps=steps,
                                                sources=sources, batch=batch, k=k, lr=lr, every=every,
                                                dev_examples=min(dev_examples, sources), seed=seed))
    start = start_metrics(cfg, device)
    train(cfg)
    records = read_metrics(run_dir)
    for name in _MODEL_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    per_step = batch * k
    curve = [{"step": 0, "samples": 0, "qe": start["kiwi"], "chrf": start["chrf"], "bleu": start["bleu"]}]
    curve += [{"step": r["step"], "samples": r["step"] * per_step, "qe": r["val/kiwi"], "chrf": r["val/chrf"],
               "bleu": r["val/bleu"]} for r in records if "val/kiwi" in r]
    lengths = [(r["step"], r["qe-ebm/len_ratio"]) for r in records if "qe-ebm/len_ratio" in r]
    end, best = curve[-1], max(curve[1:], key=lambda r: r["qe"]) if len(curve) > 1 else curve[0]
    drawn = steps * per_step
    length_start, length_end = (lengths[0][1], lengths[-1][1]) if lengths else (float("nan"), float("nan"))
    return {
        "steps": steps, "sources": sources, "sources_per_step": batch, "samples_per_source": k, "lr": lr,
        "samples_drawn": drawn, "dev_sentences": min(dev_examples, sources), "run_dir": str(run_dir),
        "start": curve[0], "end": end, "best_qe": best, "curve": curve,
        # the samples' characters over their source's, logged at every step (the first before any update)
        "sample_length_ratio": {"start": length_start, "end": length_end,
                                "max": max((v for _, v in lengths), default=float("nan"))},
        "per_1000_samples": {"qe": 1000 * (end["qe"] - start["kiwi"]) / drawn,
                             "chrf": 1000 * (end["chrf"] - start["chrf"]) / drawn,
                             "sample_length_ratio": 1000 * (length_end - length_start) / drawn},
    }
