#!/usr/bin/env bash
""":"
# English -> Mongolian, the paper's headline comparison: SFT, REINFORCE, PPO, QE-EBM static and
# dynamic, 3 seeds each, then BLEU, chrF++, COMET, COMET-Kiwi, XCOMET and paired significance.
#   accelerate launch recipes/en-mn.sh [--dry-run] [--tiny DIR] [--model nllb600m] [--seeds N] [--steps N]
#   bash recipes/en-mn.sh ...   # the same, re-run through `accelerate launch` (--accelerate-config FILE)
# Options, data sets and accelerate configs: recipes/README.md. This file is read by bash and by Python:
# bash runs the lines below up to `exec`; Python takes them for a string and runs the part after it.
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${QEEBM_PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
[ -n "$py" ] || py="$here/.venv/bin/python"; [ -x "$py" ] || py=python3
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m qeebm.recipe relaunch "$0" "$@"
":"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`
from qeebm.data_prep import ted_multi  # noqa: E402
from qeebm.recipe import Recipe, main  # noqa: E402

RECIPE = Recipe(
    name="en-mn",
    tgt_lang="khk_Cyrl",  # Halh Mongolian; mBART-50: mn_MN
    corpus=ted_multi("mn"),  # ML50's TED pairs come from this corpus
    models=("mbart50", "nllb600m"),  # published: mBART-50; NLLB-200 with --model nllb600m
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
