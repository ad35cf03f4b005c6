"""The table of published language pairs, and the entry point of ``recipes/recipe.sh``.

Every ``recipes/<pair>.sh`` is a link to ``recipes/recipe.sh``, which runs the pair named by the file
it was called as (``recipes/en-mn.sh`` -> ``en-mn``), or, called as itself, the pair named by its
first argument (``bash recipes/recipe.sh en-mn``). ``any-pair`` takes a target language instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from qeebm.data.prepare import iwslt2017, opus100, ted_multi
from qeebm.experiments.recipe import Recipe, corpus_code, main

# Published: mBART-50 with adapters; NLLB-200 with --model nllb600m. The ML50 pairs (az, bn, ka, mn,
# mr) come from the TED talks corpus ML50 took them from; en-de and en-zh are IWSLT 2017, as published.
PAIRS = {
    # The paper's headline comparison.
    "en-mn": Recipe(name="en-mn", tgt_lang="khk_Cyrl", corpus=ted_multi("mn")),  # Halh Mongolian; mBART-50 mn_MN
    "en-az": Recipe(name="en-az", tgt_lang="azj_Latn", corpus=ted_multi("az")),  # North Azerbaijani; az_AZ
    "en-ka": Recipe(name="en-ka", tgt_lang="kat_Geor", corpus=ted_multi("ka")),  # ka_GE
    "en-mr": Recipe(name="en-mr", tgt_lang="mar_Deva", corpus=ted_multi("mr")),  # mr_IN
    "en-bn": Recipe(name="en-bn", tgt_lang="ben_Beng", corpus=ted_multi("bn")),  # bn_IN
    # He et al.'s target/source token-ratio ranges for the guards, published for these two only.
    "en-de": Recipe(name="en-de", tgt_lang="deu_Latn", corpus=iwslt2017("de"), length_ratio=(1.05, 1.36)),
    "en-zh": Recipe(name="en-zh", tgt_lang="zho_Hans", corpus=iwslt2017("zh"), length_ratio=(0.86, 1.12)),
}
GENERIC = "any-pair"
LAUNCHER = "recipe"


def any_pair(language: str, corpus_lang: Optional[str] = None, corpus: str = "opus100") -> Recipe:
    """English -> ``language`` (an NLLB-200 code) on OPUS-100 (or TED), keyed by ISO 639-1."""
    key = corpus_code(language, corpus_lang)  # mn for khk_Cyrl: OPUS-100 and TED use ISO 639-1 keys
    return Recipe(name=f"en-{key}-{corpus}", tgt_lang=language,
                  corpus=opus100(key) if corpus == "opus100" else ted_multi(key))


def launch(argv: list[str]) -> int:
    """``recipes/<pair>.sh ARGS`` (``argv[0]`` names the pair) or ``recipes/recipe.sh PAIR ARGS``."""
    script, args = argv[0], list(argv[1:])
    name, prog = Path(script).name.removesuffix(".sh"), script
    names = ", ".join([*PAIRS, GENERIC])
    if name == LAUNCHER:
        if not args or args[0].startswith("-"):
            print(f"usage: {script} PAIR [ARGS]; PAIR is one of {names} (recipes/README.md)", file=sys.stderr)
            return 2
        name = args.pop(0)
        prog = f"{script} {name}"
    if name == GENERIC:
        return main(any_pair, args, prog)
    if name not in PAIRS:
        print(f"error: no recipe for the pair '{name}'; the pairs: {names}", file=sys.stderr)
        return 2
    return main(PAIRS[name], args, prog)
