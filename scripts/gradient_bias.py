"""The straight-through gradient's bias, measured: does QE-EBM's gradient point where the expected
QE score goes?

    python scripts/gradient_bias.py --model runs/tables/plateau-seed42/best --world data/tinyworld --out runs/gradient-bias

On ``--sources`` fixed dev sentences, ``--samples`` ancestral samples each from the translator (eval
mode), for each QE (the tiny Kiwi QE-EBM trains against, and the oracle: the tiny reference-based
COMET reading each sentence's reference): the gradient of the expected score estimated without bias
(score function, leave-one-out baseline) and the relaxed gradients QE-EBM can follow (straight-through,
softmax, straight-through Gumbel-softmax, ReinMax), each on two independent halves of the samples.
``qeebm.analysis.gradient_bias.agreement`` turns them into cosines corrected for the estimates' noise. Then, at
equal compute, ``--groups`` independent K-sample estimates of every estimator (REINFORCE-LOO, the
relaxations, loo-cv) for K = 2, 4, 8 (REINFORCE up to 24, the K that costs what the others cost in
QE passes): each one's signal-to-noise ratio, bias, and the cosine of a single estimate with the true
gradient. Writes ``OUT/gradient_bias.json`` and ``OUT/gradient_bias.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RELAXATIONS = ("st", "softmax", "gumbel-st", "reinmax")
# Equal compute: every estimator at K = 2, 4, 8 samples per source; REINFORCE (forward passes only)
# also at the K whose QE cost matches theirs.
KS = (2, 4, 8)
REINFORCE_KS = (2, 4, 6, 8, 12, 16, 24)
ESTIMATORS = ("reinforce", "st", "softmax", "reinmax", "loo-cv")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the translator (e.g. SFT's plateau checkpoint)")
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/gradient-bias", help="output directory (default %(default)s)")
    p.add_argument("--qes", default="kiwi,comet", help="QEs under the world's qe/ (default %(default)s)")
    p.add_argument("--sources", type=int, default=8, help="dev sentences (default %(default)s)")
    p.add_argument("--samples", type=int, default=1024, help="samples per sentence, even (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--groups", type=int, default=64,
                   help="independent K-sample estimates per estimator and K for the equal-compute table "
                        "(default %(default)s; 0 skips it)")
    args = p.parse_args(argv)

    import torch

    from qeebm.analysis.gradient_bias import (
        QE_PASSES,
        agreement,
        cv_weight,
        draw,
        estimate,
        group_rows,
        qe_cost,
        relaxed_gradient,
        score_function_gradient,
        signal_to_noise,
    )
    from qeebm.config import CorpusConfig, ModelConfig
    from qeebm.data.corpus import read_corpus
    from qeebm.qe.energy import load_energy
    from qeebm.translation.translator import Translator

    torch.set_num_threads(1)
    world, out = Path(args.world), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = read_corpus(CorpusConfig(path=str(world / "data" / "dev.tsv")), "dev", need_target=True)
    src, ref = dev.src[:args.sources], dev.tgt[:args.sources]
    tr = Translator.load(ModelConfig(name_or_path=args.model, dropout=0.0))
    result = {"model": args.model, "sources": args.sources, "samples": args.samples, "seed": args.seed, "qes": {}}
    lines = [f"Gradient of the expected QE score on {args.sources} dev sentences, {args.samples} samples each "
             f"(two halves of {args.samples // 2}), translator {args.model}.", "",
             "| QE | relaxation | cosine (halves) | relaxed split-half | unbiased split-half | corrected cosine | "
             "norm ratio |", "|:--|:--|--:|--:|--:|--:|--:|"]
    snr_lines = [f"Equal compute: {args.groups} independent estimates per estimator and K (K samples of each of the "
                 f"{args.sources} sentences, as one training step forms them); QE cost = QE forward passes per "
                 "sentence, a backward pass to the QE's inputs counted as 2. SNR: a single estimate's |E g|^2 / "
                 "E|g - E g|^2; corrected cosine: the estimator's expectation against the true gradient (its bias); "
                 "single-estimate cosine: one estimate against the true gradient, bias and noise together (mean, "
                 "its standard error).", "",
                 "| QE | estimator | K | QE cost | SNR | corrected cosine | single-estimate cosine |",
                 "|:--|:--|--:|--:|--:|--:|--:|"]

    def equal_compute(tr, energy, d, unbiased, args, out_lines, qe_name) -> dict:
        table = {}
        for estimator in ESTIMATORS:
            for k in (REINFORCE_KS if estimator == "reinforce" else KS):
                groups = min(args.groups, args.samples // k if estimator == "reinforce" else args.samples // 2 // k)
                if groups < 2:
                    continue  # a spread needs two estimates: too few samples for this K
                eta = 1.0
                if estimator == "loo-cv":
                    # Fitted, as training fits it, on samples no estimate below uses (the second half).
                    fits = [cv_weight(tr, energy, d, group_rows(d, k, args.samples // 2 // k + g), k)
                            for g in range(min(8, args.samples // 2 // k))]
                    eta = sum(fits) / len(fits)
                g = torch.Generator().manual_seed(args.seed + 2)
                t0 = time.perf_counter()
                est = torch.stack([estimate(tr, energy, d, group_rows(d, k, i), k, estimator, eta=eta, generator=g)
                                   for i in range(groups)])
                stats = signal_to_noise(est, unbiased) | {"qe_cost": qe_cost(estimator, k), "eta": eta,
                                                          "groups": groups, "seconds": time.perf_counter() - t0,
                                                          "qe_passes": QE_PASSES[estimator]}
                table[f"{estimator}@{k}"] = stats
                out_lines.append(f"| {qe_name} | {estimator}{f' (eta {eta:.2f})' if estimator == 'loo-cv' else ''} | {k} | "
                                 f"{stats['qe_cost']:g} | {stats['snr']:.3f} | {stats['corrected']:.3f} | "
                                 f"{stats['single_cosine']:.3f} ± {stats['single_cosine_se']:.3f} |")
                print(out_lines[-1], flush=True)
        return table

    for name in args.qes.split(","):
        start = time.perf_counter()
        energy = load_energy(str(world / "qe" / name), tr, freeze=True)
        torch.manual_seed(args.seed)
        d = draw(tr, energy, src, args.samples, refs=ref if energy.needs_reference else None)
        unbiased = tuple(score_function_gradient(tr, d, h) for h in (0, 1))
        rows = {"mean_score": float(d.scores.mean()), "score_std_within_source":
                float(d.scores.view(len(src), -1).std(1).mean())}
        for relaxation in RELAXATIONS:
            g = torch.Generator().manual_seed(args.seed + 1)
            relaxed = tuple(relaxed_gradient(tr, energy, d, h, relaxation, generator=g) for h in (0, 1))
            a = agreement(relaxed, unbiased)
            rows[relaxation] = a
            lines.append(f"| {name} | {relaxation} | {a['cosine']:.3f} | {a['relaxed_split_half']:.3f} | "
                         f"{a['unbiased_split_half']:.3f} | {a['corrected']:.3f} | {a['norm_ratio']:.3g} |")
        if args.groups:
            # Fresh draws: estimates that shared samples with the truth would share its noise too.
            fresh = draw(tr, energy, src, args.samples, refs=ref if energy.needs_reference else None)
            rows["equal_compute"] = equal_compute(tr, energy, fresh, unbiased, args, snr_lines, name)
        rows["seconds"] = time.perf_counter() - start
        result["qes"][name] = rows
        print(lines[-1], flush=True)
    lines += ["", *snr_lines] if args.groups else []
    (out / "gradient_bias.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gradient_bias.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
