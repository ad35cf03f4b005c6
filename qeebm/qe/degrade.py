"""Degraded versions of a reference, for any language: what an optimiser finds first when a QE
rewards it, and what the reward-hacking guards (qeebm/guards.py) exist to catch.

A QE that scores one of these above the reference it was made from has a blind spot that training
against it can find (the tiny world's energy-only runs found length within 50 steps: docs/energy.md).
``qeebm qe-check`` counts, for each kind, how often the QE prefers the reference (qeebm/analysis/qe_check.py).

Everything works on the text alone, whatever its language and script: units are whitespace words,
or characters for text written without spaces (Chinese, Japanese, Thai: ``units``). The tiny world's
own degenerations (qeebm/tinyworld/language/corruption.py) call ``over_long``, ``repeated_ngram`` and
``doubled`` here with the same random draws, so both measure the same thing.
"""

from __future__ import annotations

import random
import unicodedata

from qeebm.guards import script_share

# Kind -> the guard (qeebm.guards.GUARDS) whose check is meant to catch it.
DEGRADATIONS = {
    "doubled": "length_ratio",  # the whole reference said twice
    "over_long": "length_ratio",  # 2-6 words of another reference appended
    "repeated_ngram": "repetition",  # a 1-3 unit n-gram repeated 2-4 more times
    "truncated": "length_ratio",  # the first half of the units
    "source_copy": "copy",  # the source itself
    "other_script": "script",  # the reference written in another script
    "empty": "empty",
}

# Mean characters per whitespace token above which a text counts as written without spaces: words
# of spaced scripts average 4-8 characters, German compounds included; a Chinese or Thai sentence
# is one or a few long tokens.
UNSPACED_TOKEN_CHARS = 10


def units(text: str, spaced: bool | None = None) -> tuple[list[str], str]:
    """The text's units and the string that joins them: whitespace words and " ", or, for text
    written without spaces, its non-space characters and "". ``spaced`` says which instead of
    guessing from the text (True: words)."""
    words = text.split()
    if spaced is None:
        spaced = not words or len("".join(words)) / len(words) <= UNSPACED_TOKEN_CHARS
    if not spaced:
        return [ch for ch in text if not ch.isspace()], ""
    return words, " "


def doubled(text: str) -> str:
    """Everything said twice (the tiny world's "run-on copy")."""
    return f"{text} {text}" if text.split() else text


def over_long(text: str, filler: str, rng: random.Random, spaced: bool | None = None) -> str:
    """2-6 units of ``filler`` (another sentence of the same language) appended; the text's own
    units when the filler has none."""
    parts, sep = units(text, spaced)
    if not parts:
        return text
    extra = units(filler, sep == " ")[0] or parts
    return sep.join(parts + extra[: rng.randint(2, 6)])


def repeated_ngram(text: str, rng: random.Random, spaced: bool | None = None) -> str:
    """A 1-3 unit n-gram repeated two to four more times, in place."""
    parts, sep = units(text, spaced)
    if not parts:
        return text
    n = min(len(parts), rng.randint(1, 3))
    start = rng.randrange(len(parts) - n + 1)
    gram = parts[start:start + n]
    return sep.join(parts[:start + n] + gram * rng.randint(2, 4) + parts[start + n:])


def truncated(text: str) -> str:
    """The first half of the units (of the characters for a one-word text)."""
    parts, sep = units(text)
    if len(parts) > 1:
        return sep.join(parts[: len(parts) // 2])
    return text.strip()[: len(text.strip()) // 2]


# Latin letters in Cyrillic, for a Latin-script reference: right words, wrong script.
_CYRILLIC = dict(zip("abcdefghijklmnopqrstuvwxyz",
                     ["а", "б", "ц", "д", "е", "ф", "г", "х", "и", "й", "к", "л", "м", "н", "о", "п", "к", "р",
                      "с", "т", "у", "в", "в", "кс", "ы", "з"]))
_NAME_PARTS = (" LETTER ", " SYLLABLE ", " VOWEL SIGN ", " CHARACTER ")
_VOWELS = "AEIOU"
_CONSONANTS = "bcdfghjklmnpqrstvwxz"


def _roman(ch: str) -> str:
    """One non-Latin letter in Latin letters, from its Unicode name: a letter's name begins with
    its sound ("CYRILLIC SMALL LETTER ZHE" -> "zh", "GREEK SMALL LETTER GAMMA" -> "g", "HEBREW
    LETTER ALEF" -> "a", "CYRILLIC SMALL LETTER EL" -> "l"); syllables and vowel signs are named by
    their sound ("HANGUL SYLLABLE HAN" -> "han", "DEVANAGARI VOWEL SIGN AA" -> "aa"). Letters whose
    name says nothing (Han ideographs) become a consonant-vowel syllable drawn from the code point.
    Not a transliteration: the same words in another script, which is all an off-target check needs."""
    name = unicodedata.name(ch, "")
    marker = next((m for m in _NAME_PARTS if m in name), None)
    if marker is None:
        if unicodedata.category(ch) == "Lo":
            cp = ord(ch)
            return _CONSONANTS[cp % 20] + "aeiou"[(cp // 20) % 5]
        return ""  # a sign without a sound of its own (virama, nukta, combining accents)
    words = name.split(marker, 1)[1].split(" WITH ")[0].split()
    if words[-1] == "SIGN":
        return ""  # the soft and hard signs
    word = words[-1]  # the letter, after any modifier (SMALL, FINAL, BARRED O, SHORT I)
    if marker in (" SYLLABLE ", " VOWEL SIGN ") or name.startswith(("HIRAGANA", "KATAKANA")):
        out = word
    elif word[0] in _VOWELS:
        # Cyrillic names its sonorants with a leading E (EL, EM, EN, ER, ES, EF); Georgian names
        # its vowels AN, EN, IN: only the script tells them apart.
        rest = word[1:]
        out = rest if name.startswith("CYRILLIC") and rest and not set(rest) & set(_VOWELS) else word[0]
    else:
        out = word[:next((i for i, c in enumerate(word) if c in _VOWELS), len(word))][:4]
    out = out.lower()
    return out.capitalize() if ch.isupper() else out


def _cyrillic(ch: str) -> str:
    base = unicodedata.normalize("NFKD", ch)[0]
    out = _CYRILLIC.get(base.lower(), ch)
    return out.upper() if base.isupper() else out


def other_script(text: str) -> str:
    """The text in another script: a mostly Latin text in Cyrillic letters, any other in Latin
    letters (``_roman``). Digits, punctuation and spaces stay; a text without letters is returned
    as it is."""
    share = script_share(text, "Latn")
    if share is None:
        return text
    if share >= 0.5:
        return "".join(_cyrillic(ch) if ch.isalpha() else ch for ch in text)
    out = []
    for ch in text:
        category = unicodedata.category(ch)
        if category.startswith("L") and not unicodedata.name(ch, "").startswith("LATIN"):
            out.append(_roman(ch))
        elif category in ("Mn", "Mc"):
            out.append(_roman(ch))  # vowel signs of Indic scripts carry sound
        else:
            out.append(ch)
    return "".join(out)


def degrade(kind: str, src: str, ref: str, rng: random.Random, filler: str = "") -> str:
    """``ref`` degraded the way ``kind`` (one of ``DEGRADATIONS``) names; ``src`` is its source,
    ``filler`` another reference (over_long)."""
    if kind == "doubled":
        return doubled(ref)
    if kind == "over_long":
        return over_long(ref, filler, rng)
    if kind == "repeated_ngram":
        return repeated_ngram(ref, rng)
    if kind == "truncated":
        return truncated(ref)
    if kind == "source_copy":
        return src
    if kind == "other_script":
        return other_script(ref)
    if kind == "empty":
        return ""
    raise ValueError(f"unknown degradation {kind!r}; expected one of {', '.join(DEGRADATIONS)}")


def degrade_all(src: list[str], ref: list[str], seed: int = 0) -> dict[str, list[str]]:
    """Every kind of degradation of every reference: kind -> one text per pair. Each kind draws from
    its own seeded generator, so adding a kind changes no other; over_long's filler is the
    reference seven pairs on (another sentence of the same set)."""
    out = {}
    for kind in DEGRADATIONS:
        rng = random.Random(f"{seed}/{kind}")
        out[kind] = [degrade(kind, s, r, rng, ref[(i + 7) % len(ref)]) for i, (s, r) in enumerate(zip(src, ref))]
    return out
