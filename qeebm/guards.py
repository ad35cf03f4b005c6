"""Reward-hacking guards: cheap checks for outputs a quality estimator is known to overrate.

He et al. 2024 ("Improving Machine Translation with Human Feedback: An Exploration of Quality
Estimation as a Reward Model") found QE rewards climbing while translations got worse: off-target
language, source copies, bad length ratios, repeated n-grams. Each guard here flags one of those;
``check`` returns a per-output penalty and which guards fired, for any method's reward or energy.

How a method uses the result is its own business. A reward can subtract ``penalty``. A
differentiable energy gains no gradient from a constant, so QE-EBM should rather drop or down-weight
the flagged samples using ``hits``.

Everything works from text alone; no model is loaded, except by the optional ``language_id`` guard,
and that only from a language-ID package that is already installed and ships its own model.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from qeebm.errors import QeebmError
from qeebm.utils.langcodes import MBART50_TO_NLLB, NLLB_TO_MBART50, script_of

GUARDS = ("empty", "copy", "length_ratio", "script", "repetition", "language_id")

# He et al. 2024's target/source length-ratio ranges. Their ratio counts NLLB tokenizer tokens
# (language code and </s> included) on both sides, not characters: an English->Chinese character
# ratio is nearer 0.3, so these ranges only make sense with length_unit="tokens".
PUBLISHED_LENGTH_RATIOS: tuple[tuple[str, str, float, float], ...] = (
    ("eng_Latn", "deu_Latn", 1.05, 1.36),
    ("eng_Latn", "zho_Hans", 0.86, 1.12),
)

# Unicode character-name prefixes of each ISO 15924 script NLLB-200 uses. Han is shared by Hans,
# Hant and Jpan and cannot tell them apart; Japanese and Korean text also mixes in their own scripts.
_HAN = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH")
SCRIPT_NAME_PREFIXES: dict[str, tuple[str, ...]] = {
    "Latn": ("LATIN",),
    "Cyrl": ("CYRILLIC",),
    "Arab": ("ARABIC",),
    "Deva": ("DEVANAGARI",),
    "Beng": ("BENGALI",),
    "Geor": ("GEORGIAN",),
    "Hans": _HAN,
    "Hant": _HAN,
    "Jpan": _HAN + ("HIRAGANA", "KATAKANA"),
    "Hang": ("HANGUL",) + _HAN,
    "Grek": ("GREEK",),
    "Hebr": ("HEBREW",),
    "Armn": ("ARMENIAN",),
    "Ethi": ("ETHIOPIC",),
    "Thai": ("THAI",),
    "Laoo": ("LAO",),
    "Khmr": ("KHMER",),
    "Mymr": ("MYANMAR",),
    "Tibt": ("TIBETAN",),
    "Gujr": ("GUJARATI",),
    "Guru": ("GURMUKHI",),
    "Orya": ("ORIYA",),
    "Knda": ("KANNADA",),
    "Mlym": ("MALAYALAM",),
    "Taml": ("TAMIL",),
    "Telu": ("TELUGU",),
    "Sinh": ("SINHALA",),
    "Tfng": ("TIFINAGH",),
}

# Scripts written without spaces between words: repetition is counted over characters there.
_UNSPACED_SCRIPTS = frozenset({"Hans", "Hant", "Jpan", "Thai", "Laoo", "Khmr", "Mymr", "Tibt"})

_LANGUAGE_ID_BACKENDS = ("langid", "py3langid", "lingua")

PENALTY_UNITS = ("spread", "reward")


@dataclass
class GuardConfig:
    """Which guards run and what a hit costs; an output that trips several guards pays the largest
    of their penalties once.

    ``penalty_unit`` says what a penalty p means (``penalised_rewards``):

    * "spread" (default): a flagged output's reward is at most the lowest QE score of an unflagged
      output in the same optimiser step, minus p standard deviations of the step's QE scores. A hit
      then ranks last, on the scale of what the QE itself distinguishes: QE scores of one source's
      samples differ by hundredths, so a fixed penalty of 1.0 would make the reward's variance mostly
      guard hits, and scaling by the step's largest deviation would squeeze the QE's signal to noise.
    * "reward": the published form, QE score minus p (Kiwi scores lie around 0-1).

    Only plain field types, so the block can sit in a YAML config as it is.
    """

    penalty_unit: str = "spread"  # spread | reward

    # empty: nothing but whitespace.
    empty: bool = True
    empty_penalty: float = 1.0

    # copy: the output equals the source after case, space and punctuation are dropped, or shares
    # at least copy_threshold of its character n-grams with it (chrF-like F1, orders 1-6).
    copy: bool = True
    copy_penalty: float = 1.0
    copy_threshold: float = 0.85

    # length_ratio: len(hyp) / len(src) outside the pair's range. "tokens" counts with the
    # translator's tokenizer (pass count_tokens to check), as He et al.; "chars" counts characters.
    length_ratio: bool = True
    length_ratio_penalty: float = 1.0
    length_unit: str = "tokens"
    # [src_lang, tgt_lang, low, high] rows in length_unit; None: the published token ranges when
    # length_unit is "tokens", none at all with "chars" (set ranges for CJK targets yourself there).
    length_ratio_ranges: list[tuple[str, str, float, float]] | None = None
    length_ratio_default: tuple[float, float] = (0.5, 2.0)  # for pairs with no row

    # script: the share of letters in the target's script is below script_min_share. The script
    # comes from the target language code (khk_Cyrl -> Cyrl) unless target_script is set.
    script: bool = True
    script_penalty: float = 1.0
    target_script: str | None = None
    script_min_share: float = 0.5

    # repetition: some n-gram of order repetition_min_order..repetition_max_order occurs more than
    # repetition_max_count times and more than repetition_source_slack times more often than the
    # source's most frequent n-gram (He et al.'s rule, over words instead of subwords); or more than
    # repetition_max_share of the order-repetition_share_order n-grams are repeats.
    repetition: bool = True
    repetition_penalty: float = 1.0
    repetition_min_order: int = 2
    repetition_max_order: int = 7
    repetition_max_count: int = 3
    repetition_source_slack: int = 2
    repetition_share_order: int = 3
    repetition_max_share: float = 0.5

    # language_id: a packaged offline language-ID model disagrees with the target language.
    # Off by default; enabling it without such a package installed is an error.
    language_id: bool = False
    language_id_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.penalty_unit not in PENALTY_UNITS:
            raise QeebmError(f"guards.penalty_unit must be one of {', '.join(PENALTY_UNITS)}, got {self.penalty_unit!r}")
        if self.length_unit not in ("tokens", "chars"):
            raise QeebmError(f"guards.length_unit must be 'tokens' or 'chars', got {self.length_unit!r}")
        if self.target_script is not None and self.target_script not in SCRIPT_NAME_PREFIXES:
            raise QeebmError(
                f"guards.target_script {self.target_script!r} is not a known script; "
                f"expected one of {', '.join(sorted(SCRIPT_NAME_PREFIXES))}"
            )
        if not 1 <= self.repetition_min_order <= self.repetition_max_order:
            raise QeebmError("guards.repetition_min_order must be >= 1 and <= guards.repetition_max_order")
        for row in self.length_ratio_ranges or ():
            if len(row) != 4 or not row[2] < row[3]:
                raise QeebmError(
                    f"guards.length_ratio_ranges row {row!r} must be [src_lang, tgt_lang, low, high] with low < high"
                )
        if self.language_id and language_id_backend() is None:
            raise QeebmError(
                "guard 'language_id' is enabled but no offline language-ID package is installed "
                f"(looked for {', '.join(_LANGUAGE_ID_BACKENDS)}); install one or set guards.language_id: false"
            )

    def ranges(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Length-ratio ranges keyed by (src_lang, tgt_lang) NLLB codes."""
        rows = self.length_ratio_ranges
        if rows is None:
            rows = PUBLISHED_LENGTH_RATIOS if self.length_unit == "tokens" else ()
        return {(_nllb(s), _nllb(t)): (float(lo), float(hi)) for s, t, lo, hi in rows}

    def enabled(self) -> tuple[str, ...]:
        return tuple(name for name in GUARDS if getattr(self, name))


@dataclass
class GuardResult:
    """``penalty``: one float per output (0.0 when no guard fired). ``hits``: for every enabled
    guard, one bool per output."""

    penalty: list[float]
    hits: dict[str, list[bool]] = field(default_factory=dict)

    @property
    def any_hit(self) -> list[bool]:
        return [any(col) for col in zip(*self.hits.values())] if self.hits else [False] * len(self.penalty)


def _nllb(code: str) -> str:
    return MBART50_TO_NLLB.get(code, code)


# ----------------------------------------------------------------------------------------------
# Text helpers


def _normalise(text: str) -> str:
    """Case-folded letters, digits and marks only: "Hello, World!" and "hello world" match."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if unicodedata.category(ch)[0] in "LNM")


def _char_ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def char_ngram_f1(hyp: str, ref: str, max_order: int = 6) -> float:
    """Mean over orders 1..max_order of the character n-gram F1 of ``hyp`` against ``ref``, spaces
    removed (chrF's statistics with beta = 1: a copy check has no reason to favour recall). Orders
    longer than both strings are skipped; 0.0 when nothing is left."""
    hyp = "".join(hyp.split())
    ref = "".join(ref.split())
    scores = []
    for n in range(1, max_order + 1):
        h, r = _char_ngrams(hyp, n), _char_ngrams(ref, n)
        if not h and not r:
            continue
        overlap = sum((h & r).values())
        if overlap == 0:
            scores.append(0.0)
            continue
        precision, recall = overlap / sum(h.values()), overlap / sum(r.values())
        scores.append(2 * precision * recall / (precision + recall))
    return sum(scores) / len(scores) if scores else 0.0


def script_share(text: str, script: str) -> float | None:
    """Share of the letters of ``text`` written in ``script``; None when it has no letters."""
    prefixes = SCRIPT_NAME_PREFIXES[script]
    # NFKC first: fullwidth Latin ("ＡＢＣ") is named FULLWIDTH LATIN until folded to plain Latin.
    letters = [ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch).startswith("L")]
    if not letters:
        return None
    return sum(unicodedata.name(ch, "").startswith(prefixes) for ch in letters) / len(letters)


_WORD = re.compile(r"\w+")


def _units(text: str, script: str | None) -> list[str]:
    """Words, or characters for scripts written without spaces."""
    text = text.casefold()
    if script in _UNSPACED_SCRIPTS:
        return [ch for ch in text if unicodedata.category(ch)[0] in "LNM"]
    return _WORD.findall(text)


def _max_ngram_count(units: list[str], lo: int, hi: int) -> int:
    best = 0
    for n in range(lo, hi + 1):
        grams = Counter(tuple(units[i : i + n]) for i in range(len(units) - n + 1))
        if grams:
            best = max(best, max(grams.values()))
    return best


def _repeated_share(units: list[str], n: int) -> float:
    grams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


# ----------------------------------------------------------------------------------------------
# Language ID (optional)


def language_id_backend() -> str | None:
    """The first installed offline language-ID package, or None. Nothing is downloaded: these
    packages carry their model inside the wheel (fastText would need a separate model file)."""
    for name in _LANGUAGE_ID_BACKENDS:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def _iso639_1(code: str) -> str:
    """ISO 639-1 code that langid/lingua report for an NLLB or mBART-50 code. mBART-50 codes start
    with it (mn_MN -> mn); other NLLB languages are not covered."""
    mbart = code if code in MBART50_TO_NLLB else NLLB_TO_MBART50.get(code)
    if mbart is None:
        raise QeebmError(f"guard 'language_id' has no ISO 639-1 code for '{code}'; disable it for this language")
    return mbart.split("_")[0]


def _detector(backend: str) -> Callable[[str], str | None]:
    if backend in ("langid", "py3langid"):
        module = __import__(backend)
        return lambda text: module.classify(text)[0]
    from lingua import LanguageDetectorBuilder

    detector = LanguageDetectorBuilder.from_all_languages().build()

    def detect(text: str) -> str | None:
        lang = detector.detect_language_of(text)
        return None if lang is None else lang.iso_code_639_1.name.lower()

    return detect


# ----------------------------------------------------------------------------------------------
# The check


def check(
    src: list[str],
    hyp: list[str],
    cfg: GuardConfig,
    tgt_lang: str,
    src_lang: str = "eng_Latn",
    count_tokens: Callable[[list[str], str], list[int]] | None = None,
) -> GuardResult:
    """Run the enabled guards over (src[i], hyp[i]) pairs.

    Language codes are NLLB (mBART-50 accepted). ``src_lang`` picks the length-ratio row and how
    the source is split into words; it defaults to English, the source of every pair in the paper.
    ``count_tokens(texts, side)`` with side "src"/"tgt" (``Translator.num_tokens``) is needed when
    ``cfg.length_unit`` is "tokens".
    """
    if len(src) != len(hyp):
        raise ValueError(f"check got {len(src)} sources but {len(hyp)} hypotheses")
    n = len(hyp)
    tgt_lang, src_lang = _nllb(tgt_lang), _nllb(src_lang)
    hits: dict[str, list[bool]] = {}

    if cfg.empty:
        hits["empty"] = [not h.strip() for h in hyp]

    if cfg.copy:
        flags = []
        for s, h in zip(src, hyp):
            ns, nh = _normalise(s), _normalise(h)
            # A source without letters ("2019", "3.5 %") is rightly carried over unchanged.
            if not nh or not any(unicodedata.category(ch).startswith("L") for ch in ns):
                flags.append(False)
            else:
                flags.append(nh == ns or char_ngram_f1(h, s) >= cfg.copy_threshold)
        hits["copy"] = flags

    if cfg.length_ratio:
        if cfg.length_unit == "tokens":
            if count_tokens is None:
                raise ValueError(
                    "guard 'length_ratio' counts tokens (length_unit='tokens'): pass "
                    "count_tokens=translator.num_tokens, or set length_unit='chars'"
                )
            src_len, hyp_len = count_tokens(list(src), "src"), count_tokens(list(hyp), "tgt")
        else:
            src_len, hyp_len = [len(s.strip()) for s in src], [len(h.strip()) for h in hyp]
        lo, hi = cfg.ranges().get((src_lang, tgt_lang), cfg.length_ratio_default)
        # An empty source gives no ratio; the empty guard speaks for empty outputs.
        hits["length_ratio"] = [sl > 0 and not lo <= hl / sl <= hi for sl, hl in zip(src_len, hyp_len)]

    tgt_script = cfg.target_script or script_of(tgt_lang)
    if cfg.script:
        if tgt_script not in SCRIPT_NAME_PREFIXES:
            raise QeebmError(f"guard 'script' knows no Unicode names for script '{tgt_script}' ({tgt_lang})")
        shares = [script_share(h, tgt_script) for h in hyp]
        # No letters at all (numbers, punctuation) is not a wrong script.
        hits["script"] = [share is not None and share < cfg.script_min_share for share in shares]

    if cfg.repetition:
        src_script = script_of(src_lang)
        lo, hi = cfg.repetition_min_order, cfg.repetition_max_order
        flags = []
        for s, h in zip(src, hyp):
            units = _units(h, tgt_script)
            top = _max_ngram_count(units, lo, hi)
            src_top = _max_ngram_count(_units(s, src_script), lo, hi)
            by_count = top > cfg.repetition_max_count and top - src_top > cfg.repetition_source_slack
            by_share = _repeated_share(units, cfg.repetition_share_order) > cfg.repetition_max_share
            flags.append(by_count or by_share)
        hits["repetition"] = flags

    if cfg.language_id:
        backend = language_id_backend()
        if backend is None:
            raise QeebmError("guard 'language_id' is enabled but no offline language-ID package is installed")
        expected = _iso639_1(tgt_lang)
        detect = _detector(backend)
        # Undetectable text (None: digits, a lone name) is not counted as off-target.
        hits["language_id"] = [bool(h.strip()) and (d := detect(h)) is not None and d != expected for h in hyp]

    penalties = {name: getattr(cfg, f"{name}_penalty") for name in hits}
    penalty = [max((penalties[name] for name in hits if hits[name][i]), default=0.0) for i in range(n)]
    return GuardResult(penalty=penalty, hits=hits)


def hit_rates(result: GuardResult, normaliser: float | None = None) -> dict[str, float]:
    """``guard/<name>`` (and ``guard/any``) hit counts / normaliser; by default the local count, a
    plain rate. Pass the step's global sample count to get contributions the loop can sum."""
    norm = normaliser if normaliser is not None else max(len(result.penalty), 1)
    rates = {f"guard/{name}": sum(flags) / norm for name, flags in result.hits.items()}
    rates["guard/any"] = sum(result.any_hit) / norm
    return rates

