#!/usr/bin/env bash
""":"
# English -> any language, by its NLLB-200 code: the paper's five systems x 3 seeds on a public corpus
# (OPUS-100 by default, or TED), evaluated and compared. mBART-50 (the default) knows 52 languages;
# for the others pass --model nllb600m (and --corpus-lang, the language's key in the corpus).
#   accelerate launch recipes/any-pair.sh CODE [--dry-run] [--tiny DIR] [--model nllb600m] [--seeds N] [--steps N]
#   bash recipes/any-pair.sh CODE ...   # the same, re-run through `accelerate launch` (--accelerate-config FILE)
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
from qeebm.data_prep import opus100, ted_multi  # noqa: E402
from qeebm.recipe import Recipe, corpus_code, main  # noqa: E402


def recipe(language: str, corpus_lang: str | None = None, corpus: str = "opus100") -> Recipe:
    key = corpus_code(language, corpus_lang)  # mn for khk_Cyrl: OPUS-100 and TED use ISO 639-1 keys
    return Recipe(
        name=f"en-{key}-{corpus}",
        tgt_lang=language,
        corpus=opus100(key) if corpus == "opus100" else ted_multi(key),
        models=("mbart50", "nllb600m"),
    )


if __name__ == "__main__":
    sys.exit(main(recipe))
