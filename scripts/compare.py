"""Compare evaluated systems: scores with 95% bootstrap CIs and paired significance vs a baseline.

    python scripts/compare.py runs/sft runs/qe-ebm/seed*/ --baseline sft --out results/en-mn --plots

Each RUN is a run directory (its eval/<split>.json is read) or an evaluation report file. Reports
with the same "system" are seeds of one system. The method is described in qeebm/evaluation/compare.py.
Exit code 2 with a one-line error for missing or mismatched inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.errors import QeebmError
from qeebm.evaluation.compare import DEFAULT_CURVE_KEYS, FORMATTERS, run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory or evaluation report (.json)")
    p.add_argument("--baseline", help="system name to compare against (default: the first system given)")
    p.add_argument("--split", default="test", help="which eval/<split>.json to read from run directories (default: test)")
    p.add_argument("--metrics", help="comma-separated metrics, e.g. bleu,chrf,comet (default: sacrebleu's three "
                                     "and every per-segment score present in all reports)")
    p.add_argument("--out", help="directory for comparison.md/.csv/.json (and plots/)")
    p.add_argument("--format", default="md", choices=sorted(FORMATTERS), help="what to print (default: md)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default: 1000)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the resampling (default: 12345, as sacrebleu)")
    p.add_argument("--plots", action="store_true", help="write the forest plot (each system's difference to the baseline with its 95%% interval, per metric: forest.png) and the trained runs' curves to OUT/plots")
    p.add_argument("--curve-keys", default=",".join(DEFAULT_CURVE_KEYS),
                   help="metrics.jsonl keys (shell patterns) to plot (default: %(default)s)")
    p.add_argument("--no-sacrebleu-test", action="store_true",
                   help="skip the cross-check with sacrebleu's own paired bootstrap for BLEU and chrF++")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    try:
        text = run(args.runs, split=args.split, baseline=args.baseline,
                   metrics=split(args.metrics) if args.metrics else None, resamples=args.resamples,
                   seed=args.seed, fmt=args.format, out=args.out, plots=args.plots,
                   curve_keys=split(args.curve_keys), sacrebleu_test=not args.no_sacrebleu_test)
    except QeebmError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
