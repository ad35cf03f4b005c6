"""Wrong translations for quality-estimation data: ``analyze`` reads a target word back against every
form the grammar can produce, ``corrupt`` degrades a reference in one of the ``CORRUPTIONS`` (a
dropped phrase, a wrong case, English word order, ...), and ``degenerate`` makes the
``DEGENERATIONS`` an optimiser drives a translator to when a QE rewards it. Both work on target
strings alone, so they apply to pairs read back from disk as well as to fresh ones; the judged rows
the tiny QEs learn from are built from them (qeebm/tinyworld/judged.py).
"""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from typing import Optional

from qeebm.qe.degrade import doubled, over_long, repeated_ngram
from qeebm.tinyworld.language.grammar import Pair
from qeebm.tinyworld.language.morphology import (
    CASES,
    FLIP,
    TENSES,
    attach_case,
    harmony,
    question_particle,
    verb_forms,
    verb_words,
)
from qeebm.tinyworld.language.vocabulary import (
    AUX_WORDS,
    FUNCTION_WORDS,
    MANNER,
    NUM_EN,
    NUM_TGT,
    PARTICLES,
    POSTPOSITIONS,
    PRONOUNS,
    TIME_ADVERBS,
    lexicon,
    pron_tgt,
)

CORRUPTIONS = (
    "omission",
    "wrong_case",
    "word_order",
    "source_copy",
    "untranslated",
    "wrong_tense",
    "wrong_number",
    "repetition",
    "truncation",
)


@functools.lru_cache(maxsize=1)
def _index() -> dict:
    """Every inflected single-word form the grammar can produce -> its analyses.

    Corruptions work on strings (a caller may load pairs from disk), so they re-analyse each target
    word against this table and re-inflect it with one feature changed.
    """
    w = lexicon()
    idx = defaultdict(list)
    for n in w.nouns:
        for plural in (False,) if n.mass else (False, True):
            for case in CASES:
                words = n.forms(plural, case)
                if len(words) == 1:
                    idx[words[0]].append(("noun", n, plural, case))
                elif ("nar", case) not in idx[words[-1]]:
                    idx[words[-1]].append(("nar", case))
    for name in w.people + w.cities:
        for case in CASES:
            idx[attach_case(name.tgt, case)].append(("name", name, case))
    for key in PRONOUNS:
        for case in CASES:
            form = pron_tgt(key, case)
            if not any(a[0] == "pron" and a[2] == case for a in idx[form]):
                idx[form].append(("pron", key, case))
    for v in w.verbs:
        for key, form in verb_forms(v.tgt).items():
            idx[form].append(("verb", v, key))
    for a in w.adjs:
        idx[a.tgt].append(("adj", a))
        if a.tgt_anim != a.tgt:
            idx[a.tgt_anim].append(("adj", a))
    for k, form in NUM_TGT.items():
        idx[form].append(("num", k))
    for word in AUX_WORDS:
        idx[word].append(("aux", word))
    for word in PARTICLES:
        idx[word].append(("q", word))
    for word in FUNCTION_WORDS:
        idx[word].append(("func", word))
    for en, tgt in MANNER:
        idx[tgt].append(("adv", en))
    for en, tgt, _ in TIME_ADVERBS:
        if " " not in tgt:
            idx[tgt].append(("adv", en))
    return dict(idx)


def analyze(word: str) -> list:
    """Analyses of one target word (capitalisation-insensitive for ordinary words)."""
    idx = _index()
    out = list(idx.get(word, ()))
    low = word[:1].lower() + word[1:]
    if low != word:
        out += [a for a in idx.get(low, ()) if a[0] != "name"]
    return out


_PUNCT = frozenset({",", ".", "?"})
_VERB_FINITE = frozenset({"hab", "hab_neg", "past", "past_neg", "fut", "fut_neg", "inf", "conv"})


def _tokenize(text: str) -> list:
    toks = []
    for raw in text.split():
        tail = []
        while raw and raw[-1] in _PUNCT:
            tail.insert(0, raw[-1])
            raw = raw[:-1]
        if raw:
            toks.append(raw)
        toks += tail
    # Sentence-initial capitals are orthography, not part of the word, unless the word is a name.
    if toks and not any(a[0] == "name" for a in _index().get(toks[0], ())):
        toks[0] = toks[0][:1].lower() + toks[0][1:]
    return toks


def _join(toks: list) -> str:
    words = [t for t in toks]
    s = " ".join(words)
    for p in _PUNCT:
        s = s.replace(" " + p, p)
    return s[:1].upper() + s[1:]


def _words(toks: list) -> list:
    return [i for i, t in enumerate(toks) if t not in _PUNCT]


def _kinds(tok: str) -> set:
    return {a[0] for a in analyze(tok)}


def _predicate_span(toks: list) -> tuple:
    """(start, end) of the sentence-final predicate: verb + auxiliaries + question particle."""
    idx = _words(toks)
    if not idx:
        return 0, 0
    end = idx[-1] + 1
    j = len(idx) - 1
    while j >= 0 and _kinds(toks[idx[j]]) & {"q", "aux"}:
        j -= 1
    if j >= 0 and "verb" in _kinds(toks[idx[j]]):
        return idx[j], end
    if j < len(idx) - 1:
        return idx[j + 1], end
    return idx[-1], end


def _content(toks: list, exclude: tuple = (0, 0)) -> list:
    """Indices of content words outside ``exclude`` (nouns, names, pronouns, adjectives, numbers...)."""
    out = []
    for i in _words(toks):
        if exclude[0] <= i < exclude[1]:
            continue
        kinds = _kinds(toks[i])
        if kinds & {"aux", "q", "func"} and not kinds & {"noun", "name", "pron"}:
            continue
        out.append(i)
    return out


def _english_for(tok: str, src: str, rng: random.Random) -> str:
    for a in analyze(tok):
        if a[0] == "noun":
            return a[1].en_pl if a[2] else a[1].en
        if a[0] == "name":
            return a[1].en
        if a[0] == "adj":
            return a[1].en
        if a[0] == "pron":
            return PRONOUNS[a[1]][0 if a[2] == "nom" else 1]
        if a[0] == "verb":
            v = a[1]
            if a[2].startswith("past"):
                return v.en_past
            if a[2] == "conv":
                return " ".join(v.en_ing())
            return v.en
        if a[0] == "num":
            return NUM_EN[a[1]]
        if a[0] == "adv":
            return a[1]
    if tok.isdigit():
        return tok
    words = [w.strip(",.?") for w in src.split()]
    words = [w for w in words if len(w) > 2] or words or ["the"]
    return rng.choice(words).lower()


def _reinflect_case(tok: str, rng: random.Random) -> Optional[str]:
    cands = [a for a in analyze(tok) if a[0] in ("noun", "name", "pron", "nar")]
    if not cands:
        return None
    a = rng.choice(cands)
    case = a[-1]
    if a[0] != "pron" and case != "nom" and rng.random() < 0.3:
        # Right case, wrong harmony: the allomorph of the opposite vowel class.
        if a[0] == "noun":
            base = a[1].tgt_pl if a[2] else a[1].tgt
        elif a[0] == "name":
            base = a[1].tgt
        else:
            base = "нар"
        base = base.split()[-1]
        wrong = attach_case(base, case, FLIP[harmony(base)])
        if wrong != tok:
            return wrong
    new_case = rng.choice([c for c in CASES if c != case])
    if a[0] == "noun":
        return " ".join(a[1].forms(a[2], new_case))
    if a[0] == "name":
        return attach_case(a[1].tgt, new_case)
    if a[0] == "nar":
        return attach_case("нар", new_case)
    return pron_tgt(a[1], new_case)


def _fix_particles(toks: list) -> list:
    out = list(toks)
    for i, t in enumerate(out):
        if t in PARTICLES and i > 0 and out[i - 1] not in _PUNCT:
            out[i] = question_particle(out[i - 1])
    return out


_PREMODIFIERS = frozenset({"энэ", "тэр", "эдгээр", "тэдгээр", "бүх", "олон", "хэдэн", "жаахан"})
_POSTMODIFIERS = frozenset(set(POSTPOSITIONS.values()) | {"бүр", "хамт"})


def _is_premodifier(tok: str) -> bool:
    if tok in _PUNCT:
        return False
    if tok.isdigit() or tok in _PREMODIFIERS:
        return True
    return any(a[0] in ("adj", "num") or (a[0] in ("noun", "name", "pron") and a[-1] == "gen") for a in analyze(tok))


def _c_omission(toks, pair, rng):
    cands = _content(toks, _predicate_span(toks))
    if not cands and len(_words(toks)) >= 2:
        cands = _words(toks)
    if not cands:
        return None
    i = rng.choice(cands)
    start, end = i, i + 1
    if rng.random() < 0.6:  # the whole phrase: its modifiers go with the head
        while start > 0 and _is_premodifier(toks[start - 1]):
            start -= 1
        if end < len(toks) and toks[end] in _POSTMODIFIERS:
            end += 1
    return toks[:start] + toks[end:]


def _c_wrong_case(toks, pair, rng):
    cands = [i for i in _words(toks) if _kinds(toks[i]) & {"noun", "name", "pron", "nar"}]
    rng.shuffle(cands)
    for i in cands:
        new = _reinflect_case(toks[i], rng)
        if new and new != toks[i]:
            return toks[:i] + new.split() + toks[i + 1:]
    words = _words(toks)
    if not words:
        return None
    i = rng.choice(words)
    return toks[:i] + [attach_case(toks[i], rng.choice(("acc", "dat", "abl", "ins")))] + toks[i + 1:]


def _c_word_order(toks, pair, rng):
    start, end = _predicate_span(toks)
    words = _words(toks)
    if rng.random() < 0.6 and words and start > words[0] + 0:
        # Verb right after the subject, as in English.
        body = toks[:start] + toks[end:]
        first_end = 1
        while first_end < len(body) and body[first_end - 1] not in _PUNCT and not (
            _kinds(body[first_end - 1]) & {"noun", "name", "pron", "nar"}
        ):
            first_end += 1
        moved = body[:first_end] + toks[start:end] + body[first_end:]
        if moved != toks:
            return moved
    if len(words) < 2:
        return None
    for _ in range(10):
        i, j = sorted(rng.sample(words, 2))
        if toks[i] != toks[j]:
            out = list(toks)
            out[i], out[j] = out[j], out[i]
            return out
    return None


def _c_untranslated(toks, pair, rng):
    cands = _content(toks) or _words(toks)
    if not cands:
        return None
    k = 1 if rng.random() < 0.6 or len(cands) < 3 else rng.randint(2, min(3, len(cands)))
    chosen = set(rng.sample(cands, k))
    return [_english_for(t, pair.src, rng) if i in chosen else t for i, t in enumerate(toks)]


def _c_wrong_tense(toks, pair, rng):
    verbs = [i for i in _words(toks) if any(a[0] == "verb" and a[2] in _VERB_FINITE for a in analyze(toks[i]))]
    if verbs:
        i = verbs[-1]
        a = next(a for a in analyze(toks[i]) if a[0] == "verb" and a[2] in _VERB_FINITE)
        verb, key = a[1], a[2]
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        end = i + 2 if nxt in ("байна", "байсан") else i + 1
        question = end < len(toks) and toks[end] in PARTICLES
        neg = key.endswith("_neg")
        if key == "conv" and nxt not in ("байна", "байсан"):
            current = "conv"
        elif nxt == "байна":
            current = "prog"
        elif nxt == "байсан":
            current = "pprog"
        else:
            current = {"hab": "pres", "past": "past", "fut": "fut", "inf": "fut"}.get(key.replace("_neg", ""), "pres")
        choices = [t for t in TENSES if t != current]
        new = verb_words(verb.tgt, rng.choice(choices), neg, question)
        return _fix_particles(toks[:i] + new + toks[end:])
    # A copular sentence: swap the auxiliary, or add one where the present has none.
    start, end = _predicate_span(toks)
    span = [t for t in toks[start:end] if t not in PARTICLES]
    aux = [t for t in span if t in AUX_WORDS]
    tail = [t for t in toks[start:end] if t in PARTICLES]
    if not aux:
        return _fix_particles(toks[:end - len(tail)] + ["байсан"] + toks[end - len(tail):])
    neg = any(t in ("биш", "байхгүй", "байгаагүй") for t in aux)
    options = [["байгаагүй"], ["байхгүй", "болно"], ["биш"]] if neg else [["байсан"], ["байх", "болно"], ["байна"]]
    options = [o for o in options if o != aux]
    aux_start = start + span.index(aux[0])
    return _fix_particles(toks[:aux_start] + rng.choice(options) + toks[aux_start + len(aux):])


def _c_wrong_number(toks, pair, rng):
    words = _words(toks)
    digits = [i for i in words if toks[i].isdigit()]
    numw = [i for i in words if "num" in _kinds(toks[i])]
    if digits or numw:
        i = rng.choice(digits + numw)
        if toks[i].isdigit():
            n = int(toks[i])
            new = n
            while new == n:
                new = max(1, n + rng.choice((-3, -2, -1, 1, 2, 5, 10, n)))
            return toks[:i] + [str(new)] + toks[i + 1:]
        current = next(a[1] for a in analyze(toks[i]) if a[0] == "num")
        new = rng.choice([k for k in NUM_TGT if k != current])
        return toks[:i] + [NUM_TGT[new]] + toks[i + 1:]
    nars = [i for i in words if "nar" in _kinds(toks[i]) and i > 0]
    nouns = [i for i in words if i + 1 not in nars and any(a[0] == "noun" and not a[1].mass for a in analyze(toks[i]))]
    prons = [i for i in words if "pron" in _kinds(toks[i])]
    if nouns or nars:
        i = rng.choice(nouns + nars)
        if i in nars:  # "багш нарыг" -> "багшийг": the case moves back onto the noun
            case = next(a[1] for a in analyze(toks[i]) if a[0] == "nar")
            prev = analyze(toks[i - 1])
            noun = next((a[1] for a in prev if a[0] == "noun"), None)
            head = noun.forms(False, case) if noun else [toks[i - 1]]
            return toks[:i - 1] + head + toks[i + 1:]
        a = next(a for a in analyze(toks[i]) if a[0] == "noun" and not a[1].mass)
        return toks[:i] + a[1].forms(not a[2], a[3]) + toks[i + 1:]
    if prons:
        i = rng.choice(prons)
        a = next(a for a in analyze(toks[i]) if a[0] == "pron")
        other = {"1sg": "1pl", "1pl": "1sg", "2sg": "1pl", "3m": "3pl", "3f": "3pl", "3pl": "3m"}[a[1]]
        return toks[:i] + [pron_tgt(other, a[2])] + toks[i + 1:]
    if not words:
        return None
    i = words[0]
    return toks[:i] + [NUM_TGT[rng.randint(2, 10)]] + toks[i:]


def _c_repetition(toks, pair, rng):
    words = _words(toks)
    if not words:
        return None
    i = rng.choice(words)
    j = i + 1
    if rng.random() < 0.3:
        while j < len(toks) and j - i < rng.randint(2, 3) and toks[j] not in _PUNCT:
            j += 1
    return toks[:j] + toks[i:j] + toks[j:]


def _c_truncation(toks, pair, rng):
    words = _words(toks)
    if len(words) < 2:
        if words and len(toks[words[0]]) > 2:
            w = toks[words[0]]
            return [w[: len(w) // 2]]
        return None
    keep = rng.randint(max(1, len(words) // 3), len(words) - 1)
    out = toks[: words[keep - 1] + 1]
    while out and out[-1] in _PUNCT:
        out.pop()
    return out


_CORRUPTERS = {
    "omission": _c_omission,
    "wrong_case": _c_wrong_case,
    "word_order": _c_word_order,
    "untranslated": _c_untranslated,
    "wrong_tense": _c_wrong_tense,
    "wrong_number": _c_wrong_number,
    "repetition": _c_repetition,
    "truncation": _c_truncation,
}


def corrupt(pair: Pair, kind: str, rng: random.Random) -> str:
    """A degraded target for ``pair.src``, of the given kind (see ``CORRUPTIONS``).

    Works on the target string alone, so it applies to pairs read back from disk. The result
    differs from ``pair.tgt`` whenever the kind allows it (a few tries, then the last attempt).
    """
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; expected one of {CORRUPTIONS}")
    if kind == "source_copy":
        return pair.src
    toks = _tokenize(pair.tgt)
    out = pair.tgt
    for _ in range(5):
        new = _CORRUPTERS[kind](toks, pair, rng)
        if new is None:
            continue
        out = _join(new)
        if out != pair.tgt:
            return out
    return out


# What an optimiser drives a translator to when a QE rewards it: the tiny world's QEs learn from
# these too, scored by the quality target like any other output (qeebm/tinyworld/build.py).
DEGENERATIONS = ("over_long", "repeated_ngram", "run_on_copy", "off_target_script")

_ROMAN = dict(zip("абвгдеёжзийклмнопрстуфхцчшщъыьэюяөү",
                  ["a", "b", "v", "g", "d", "ye", "yo", "j", "z", "i", "i", "k", "l", "m", "n", "o", "p", "r",
                   "s", "t", "u", "f", "kh", "ts", "ch", "sh", "sh", "", "y", "", "e", "yu", "ya", "oe", "ue"]))


def romanize(text: str) -> str:
    """The target text in Latin letters: right words, wrong script (an off-target output)."""
    return "".join(_ROMAN.get(ch, _ROMAN.get(ch.lower(), ch).capitalize() if ch.isupper() else ch) for ch in text)


def degenerate(text: str, kind: str, rng: random.Random, filler: str = "") -> str:
    """``text`` (a translation or a reference) made degenerate in the way ``kind`` names:
    "over_long" appends 2-6 words of ``filler`` (another target sentence), "repeated_ngram" repeats
    a 1-3 word n-gram two to four more times, "run_on_copy" says everything twice, and
    "off_target_script" writes it in Latin letters. An empty text stays empty."""
    if kind not in DEGENERATIONS:
        raise ValueError(f"unknown degeneration {kind!r}; expected one of {DEGENERATIONS}")
    if not text.split():
        return text
    # The language-independent three are qe-check's degradations too (qeebm/qe/degrade.py), over
    # words as this language is written.
    if kind == "over_long":
        return over_long(text, filler, rng, spaced=True)
    if kind == "repeated_ngram":
        return repeated_ngram(text, rng, spaced=True)
    if kind == "run_on_copy":
        return doubled(text)
    return romanize(text)
