"""The straight-through gradient's bias, measured: does QE-EBM's gradient point where the expected
QE score goes?

    python scripts/gradient_bias.py --model runs/v3/plateau-seed42/best --world data/tinyworld --out runs/gradient-bias

On ``--sources`` fixed dev sentences, ``--samples`` ancestral samples each from the translator (eval
mode), for each QE (the tiny Kiwi QE-EBM trains against, and the oracle: the tiny reference-based
COMET reading each sentence's reference): the gradient of the expected score estimated without bias
(score function, leave-one-out baseline) and the relaxed gradients QE-EBM can follow (straight-through,
softmax, straight-through Gumbel-softmax), each on two independent halves of the samples.
``qeebm.gradient_bias.agreement`` turns them into cosines corrected for the estimates' noise. Writes
``OUT/gradient_bias.json`` and ``OUT/gradient_bias.md``.
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

RELAXATIONS = ("st", "softmax", "gumbel-st")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the translator (e.g. SFT's plateau checkpoint)")
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/gradient-bias", help="output directory (default %(default)s)")
    p.add_argument("--qes", default="kiwi,comet", help="QEs under the world's qe/ (default %(default)s)")
    p.add_argument("--sources", type=int, default=8, help="dev sentences (default %(default)s)")
    p.add_argument("--samples", type=int, default=1024, help="samples per sentence, even (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch

    from qeebm.config import ModelConfig
    from qeebm.data import read_corpus
    from qeebm.config import CorpusConfig
    from qeebm.gradient_bias import agreement, draw, relaxed_gradient, score_function_gradient
    from qeebm.qe.energy import load_energy
    from qeebm.translator import Translator

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
        rows["seconds"] = time.perf_counter() - start
        result["qes"][name] = rows
        print(lines[-1], flush=True)
    (out / "gradient_bias.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gradient_bias.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
