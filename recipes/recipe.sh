#!/usr/bin/env bash
""":"
# The published comparison for one language pair: SFT, REINFORCE, PPO, QE-EBM static and dynamic and
# QE finetuning, 3 seeds each, then BLEU, chrF++, COMET, COMET-Kiwi, XCOMET and paired significance.
# recipes/<pair>.sh links here and runs the pair it is named after; the table of pairs is
# qeebm/experiments/pairs.py (en-mn, en-az, en-ka, en-mr, en-bn, en-de, en-zh, and any-pair CODE).
#   accelerate launch recipes/en-mn.sh [--check] [--dry-run] [--tiny DIR] [--model nllb600m] [--seeds N] [--steps N]
#   bash recipes/en-mn.sh ...            # the same, re-run through `accelerate launch` (--accelerate-config FILE)
#   bash recipes/recipe.sh en-mn ...     # the same, the pair as the first argument
#   bash recipes/any-pair.sh kat_Geor --model nllb600m   # English -> any NLLB-200 code, on OPUS-100
# Options, data sets, access to the gated models, accelerate configs: recipes/README.md.
# This file is read by bash and by Python: bash runs the lines below up to `exec`; Python takes them
# for a string and runs the part after it.
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${QEEBM_PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
[ -n "$py" ] || py="$here/.venv/bin/python"; [ -x "$py" ] || py=python3
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m qeebm.experiments.recipe relaunch "$0" "$@"
":"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`
from qeebm.experiments.pairs import launch  # noqa: E402

if __name__ == "__main__":
    sys.exit(launch(sys.argv))
