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

import numpy as np
import torch

from qeebm.config import load_config
from qeebm.data.corpus import read_corpus
from qeebm.errors import QeebmError
from qeebm.training.loop import ValidationScorers, train, validate
from qeebm.translation.translator import Translator
from qeebm.utils.runlog import read_metrics

# Model directories a run writes; the probe needs only its log.
_MODEL_DIRS = ("best", "final", "checkpoints")
# Steps in the running mean of the samples' QE score: each step draws other sources.
SMOOTHING = 5


def qe_only_overrides(method: str, k: int) -> list[str]:
    """Config overrides that make ``method`` (qe-ebm, reinforce or ppo) optimise the QE alone: no CE
    term, no guards, the full weight on the QE from the first step, K pure ancestral samples."""
    sampling = [f"sampling.num_samples={k}", "sampling.temperature=1.0", "sampling.top_k=0", "sampling.top_p=1.0"]
    if method == "qe-ebm":
        own = ["ce_weight=0.0", "energy_weight=1.0", "energy_ramp_steps=0", "weighting=absolute", "guards=false"]
    elif method == "reinforce":
        own = ["ce_weight=0.0", "pg_weight=1.0", "guards=false"]
    elif method == "ppo":
        own = ["ce_weight=0.0", "guards=false"]
    else:
        raise QeebmError(f"no QE-only form of method '{method}': choose qe-ebm, reinforce or ppo")
    section = method.replace("-", "_")
    return [f"{section}.{o}" for o in own + sampling]


def start_metrics(cfg, device=None) -> dict[str, float]:
    """The validation metrics (``loop.validate``: dev BLEU, chrF++, loss and the QE metrics of
    ``cfg.eval``) of ``cfg.model`` before any training step: the common start of every curve."""

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
                      steps: int, sources: int, batch: int = 16, k: int = 5, lr: float = 3e-4, validations: int = 8,
                      dev_examples: int = 100, seed: int = 42, device=None) -> dict:
    """A short energy-only QE-EBM run (``probe_overrides``) against ``qe``, a CometKiwi, in
    ``run_dir`` (replaced if it exists; its weights are removed afterwards): how far the QE score of
    the samples rises, how far dev chrF++ falls and how long the samples get (``summarise``)."""

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
    return summarise(records, start, steps=steps, per_step=batch * k) | {
        "steps": steps, "sources": sources, "sources_per_step": batch, "samples_per_source": k, "lr": lr,
        "samples_drawn": steps * batch * k, "dev_sentences": min(dev_examples, sources), "run_dir": str(run_dir)}


def summarise(records: list[dict], start: dict, *, steps: int, per_step: int, window: int = SMOOTHING) -> dict:
    """The probe's numbers from its log (``records``) and its start metrics (``start_metrics``).

    ``samples_qe``: the QE score of the samples the optimiser draws (its objective, logged at every
    step; step 1's samples come from the starting model), as running means over ``window`` steps
    (the sources change from step to step): the first, the peak and its last step, the last.
    ``sample_length_ratio``: the samples' characters over their source's at step 1, its maximum
    and its step, at the end. ``curve``: dev greedy QE, chrF++ and BLEU at step 0 and each
    validation, with the samples' length at that step; ``per_step``: the samples' QE score and length
    at every step. ``per_1000_samples``: the changes over the
    first validation interval per 1,000 samples (later the QE saturates or collapses and a rate
    says little). ``qe_rise``, ``chrf_fall``: the samples' QE peak over its start, and dev chrF++'s
    start over its lowest validation."""
    nan = float("nan")
    by_step = {r["step"]: r for r in records if "qe-ebm/sample_score" in r}
    score = np.array([by_step[t]["qe-ebm/sample_score"] for t in sorted(by_step)])
    length = np.array([by_step[t]["qe-ebm/len_ratio"] for t in sorted(by_step)])
    if not len(score):
        raise QeebmError("the probe's log has no sample scores (qe-ebm/sample_score)")
    w = min(window, len(score))
    smooth = np.convolve(score, np.ones(w) / w, mode="valid")
    peak = int(np.argmax(smooth))
    curve = [{"step": 0, "samples": 0, "qe": start["kiwi"], "chrf": start["chrf"], "bleu": start["bleu"],
              "sample_length_ratio": float(length[0])}]
    curve += [{"step": r["step"], "samples": r["step"] * per_step, "qe": r["val/kiwi"], "chrf": r["val/chrf"],
               "bleu": r["val/bleu"],
               "sample_length_ratio": by_step[r["step"]]["qe-ebm/len_ratio"] if r["step"] in by_step else nan}
              for r in records if "val/kiwi" in r]
    first = curve[1] if len(curve) > 1 else curve[0]
    per_1000 = 1000 / first["samples"] if first["samples"] else nan
    return {
        "samples_qe": {"start": float(smooth[0]), "peak": float(smooth[peak]), "peak_step": peak + w,
                       "end": float(smooth[-1]), "window": w},
        "sample_length_ratio": {"start": float(length[0]), "max": float(length.max()),
                                "max_step": int(np.argmax(length)) + 1, "end": float(length[-1])},
        "curve": curve,
        "per_step": [{"step": t, "samples_qe": by_step[t]["qe-ebm/sample_score"],
                      "sample_length_ratio": by_step[t]["qe-ebm/len_ratio"]} for t in sorted(by_step)],
        "per_1000_samples": {"dev_qe": (first["qe"] - curve[0]["qe"]) * per_1000,
                             "dev_chrf": (first["chrf"] - curve[0]["chrf"]) * per_1000,
                             "sample_length_ratio": (first["sample_length_ratio"] - curve[0]["sample_length_ratio"])
                             * per_1000},
        "qe_rise": float(smooth[peak] - smooth[0]),
        "chrf_fall": curve[0]["chrf"] - min(r["chrf"] for r in curve),
    }
