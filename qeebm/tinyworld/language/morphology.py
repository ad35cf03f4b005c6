"""Word-level morphology of both languages: vowel harmony, the seven noun cases, plurals and question
particles of the target, its verb forms and finite verb groups, and the English plural, third-person,
-ing, past and a/an rules. Each is a pure function of a word, with no lexicon and no randomness, so
the lexicon builds its entries with them, the renderers inflect with them and the corruptions
re-inflect with them, and every rule can be checked by hand (tests/unit/test_language.py).
"""

from __future__ import annotations

from typing import Optional

# =============================================================================================
# Phonology and noun morphology
# =============================================================================================

_VOWELS = frozenset("аэиоуөүыяеёю")
# Stem-final consonants after which the front -ий- linking vowel is used even in back-vowel words.
_PALATAL = frozenset("жчшгк")
_HARMONY_OF = {
    "а": "a", "у": "a", "я": "a", "ю": "a", "ы": "a",
    "о": "o", "ё": "o",
    "э": "e", "ү": "e", "е": "e",
    "ө": "ö",
}
_LONG = {"a": "аа", "o": "оо", "e": "ээ", "ö": "өө"}
_SHORT = {"a": "а", "o": "о", "e": "э", "ö": "ө"}
_COMITATIVE = {"a": "тай", "o": "той", "e": "тэй", "ö": "тэй"}
FLIP = {"a": "e", "o": "ö", "e": "a", "ö": "o"}

CASES = ("nom", "acc", "gen", "dat", "abl", "ins", "com")


def harmony(word: str) -> str:
    """The harmony class of a word: "a" or "o" (back), "e" or "ö" (front).

    The last vowel that is not the neutral и decides. That makes suffixes stacked on a plural
    follow the plural suffix (ном -> номууд -> номуудаас) and gives mixed-vowel foreign names one
    deterministic answer. Words whose only vowel is и behave as front, as in Khalkha.
    """
    for ch in reversed(word.lower()):
        h = _HARMONY_OF.get(ch)
        if h:
            return h
    return "e"


def _is_back(h: str) -> bool:
    return h in ("a", "o")


def ending(word: str) -> str:
    """"long" (two vowel letters or a diphthong in -й), "short" (one final vowel) or "cons".

    Suffixes join differently to each: a long vowel takes a glide г, a short final vowel is
    dropped before a vowel-initial suffix, a consonant takes the suffix directly.
    """
    w = word.lower()
    if w.endswith("й") or (len(w) >= 2 and w[-1] in _VOWELS and w[-2] in _VOWELS):
        return "long"
    if w[-1] in _VOWELS:
        return "short"
    return "cons"


def pluralize(stem: str) -> str:
    """Suffix plural -ууд/-үүд (back/front); -нууд after a long vowel, final short vowel dropped."""
    suffix = "ууд" if _is_back(harmony(stem)) else "үүд"
    end = ending(stem)
    if end == "long":
        return stem + "н" + suffix
    if end == "short":
        return stem[:-1] + suffix
    return stem + suffix


def attach_case(form: str, case: str, h: Optional[str] = None) -> str:
    """Add a case suffix to a noun form (stem, plural or name). ``h`` overrides the harmony class.

    nom: -          acc: -ыг/-ийг, -г after a long vowel
    gen: -ын/-ийн, -ы/-ий after н, -н after -й, -ны/-ний after a long vowel
    dat: -д, -т after г в р с, -ид after ж ч ш, vowel + д after д т
    abl: -аас/-оос/-ээс/-өөс   ins: -аар/-оор/-ээр/-өөр   (glide г after a long vowel)
    com: -тай/-той/-тэй (-тэй also after ө)
    """
    if case == "nom":
        return form
    h = h or harmony(form)
    back = _is_back(h)
    end = ending(form)
    if case == "com":
        return form + _COMITATIVE[h]
    if case == "dat":
        if end != "cons":
            return form + "д"
        last = form[-1]
        if last in "гврс":
            return form + "т"
        if last in "дт":
            return form + _SHORT[h] + "д"
        if last in "жчш":
            return form + "ид"
        return form + "д"
    if case in ("abl", "ins"):
        tail = _LONG[h] + ("с" if case == "abl" else "р")
        if end == "long":
            return form + "г" + tail
        if end == "short":
            return form[:-1] + tail
        return form + tail
    if case not in ("acc", "gen"):
        raise ValueError(f"unknown case {case!r}; expected one of {CASES}")
    if end == "long":
        if case == "acc":
            return form + "г"
        if form.endswith("й"):
            return form + "н"
        return form + ("ны" if back else "ний")
    if end == "short":
        stem = form[:-1]
        link = "ы" if back else "ий"
    else:
        stem = form
        link = "ы" if back and form[-1] not in _PALATAL else "ий"
    if case == "acc":
        return stem + link + "г"
    if end == "cons" and form[-1] == "н":
        return stem + link
    return stem + link + "н"


def question_particle(word: str) -> str:
    """юу/юү after a long vowel or diphthong, else уу/үү; harmony from the word minus neutral -гүй."""
    root = word[:-3] if word.endswith("гүй") and len(word) > 3 else word
    back = _is_back(harmony(root))
    if ending(word) == "long":
        return "юу" if back else "юү"
    return "уу" if back else "үү"


# =============================================================================================
# Verb morphology
# =============================================================================================

TENSES = ("pres", "past", "fut", "prog", "pprog")


def _needs_link(stem: str) -> bool:
    """Whether a consonant-initial suffix needs a linking vowel (after ж ч ш or a cluster)."""
    if stem[-1] in _VOWELS or stem[-1] == "й":
        return False
    if stem[-1] in "жчш":
        return True
    return len(stem) >= 2 and stem[-2] not in _VOWELS and stem[-2] != "й"


def _link_vowel(stem: str, h: str) -> str:
    return "и" if stem[-1] in "жчш" else _SHORT[h]


def verb_forms(stem: str) -> dict:
    """Every single-word form of a verb stem, keyed by form name.

    hab (habitual present) -даг, past -сан, fut -на, inf (future in questions) -х, conv (converb,
    also the progressive with байна) -ж/-ч, and the negatives hab_neg -даггүй, past_neg -аагүй,
    fut_neg -хгүй.
    """
    h = harmony(stem)
    s, long_ = _SHORT[h], _LONG[h]
    vowel_final = stem[-1] in _VOWELS or stem[-1] == "й"
    link = "" if vowel_final else _link_vowel(stem, h)
    inf = stem + link + "х"
    if vowel_final:
        fut = stem + "н" + s
        conv = stem + "ж"
        past_neg = stem + "г" + long_ + "гүй"
    else:
        fut = stem + (link if _needs_link(stem) else "") + "н" + s
        if _needs_link(stem):
            conv = stem + link + "ж"
        else:
            conv = stem + ("ч" if stem[-1] in "вгрс" else "ж")
        past_neg = stem + long_ + "гүй"
    hab = stem + "д" + s + "г"
    return {
        "hab": hab,
        "hab_neg": hab + "гүй",
        "past": stem + "с" + s + "н",
        "past_neg": past_neg,
        "fut": fut,
        "fut_neg": inf + "гүй",
        "inf": inf,
        "conv": conv,
    }


def verb_words(stem: str, tense: str, neg: bool = False, question: bool = False) -> list:
    """The finite verb group: one word, or converb/negative + auxiliary байна/байсан."""
    f = verb_forms(stem)
    if tense == "pres":
        return [f["hab_neg"] if neg else f["hab"]]
    if tense == "past":
        return [f["past_neg"] if neg else f["past"]]
    if tense == "fut":
        if neg:
            return [f["fut_neg"]]
        return [f["inf"]] if question else [f["fut"]]
    aux = "байна" if tense == "prog" else "байсан"
    return [f["fut_neg"] if neg else f["conv"], aux]


def copula_words(kind: str, tense: str, neg: bool, question: bool) -> list:
    """"to be": nothing in the present with an adjective or noun predicate, байна with a place."""
    if tense == "past":
        return ["байгаагүй" if neg else "байсан"]
    if tense == "fut":
        if neg:
            return ["байхгүй", "болно"]
        return ["байх"] if question else ["байх", "болно"]
    if kind in ("cop_adj", "cop_noun"):
        return ["биш"] if neg else []
    return ["байхгүй" if neg else "байна"]


# =============================================================================================
# English morphology
# =============================================================================================

_DOUBLE_FINAL = frozenset(
    "run swim sit cut begin win get forget drop stop shop plan chat hug dig jog nod rob put hit".split()
)


def english_plural(word: str) -> str:
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def english_third(word: str) -> str:
    if word in ("have", "be", "do", "go"):
        return {"have": "has", "be": "is", "do": "does", "go": "goes"}[word]
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def english_ing(word: str) -> str:
    if word in _DOUBLE_FINAL:
        return word + word[-1] + "ing"
    if word.endswith("ie"):
        return word[:-2] + "ying"
    if word.endswith("e") and not word.endswith(("ee", "ye", "oe")):
        return word[:-1] + "ing"
    return word + "ing"


def english_past(word: str) -> str:
    if word in _DOUBLE_FINAL:
        return word + word[-1] + "ed"
    if word.endswith("e"):
        return word + "d"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ied"
    return word + "ed"


_AN_WORDS = frozenset({"hour", "honest", "heir"})


def a_or_an(word: str) -> str:
    w = word.lower()
    if w in _AN_WORDS:
        return "an"
    if w.startswith(("uni", "use", "eu", "one", "uk")):
        return "a"
    return "an" if w[0] in "aeiou" else "a"
