"""Tiny World: a deterministic, offline English -> "Tiny Mongolian" (khk_Cyrl) language pair.

Every test and demo of the project trains on this pair instead of downloading a corpus, so it must
be exactly reproducible from a seed (pure standard library, one ``random.Random`` per call, no
global state) and hard enough that a small transformer needs thousands of pairs and still makes
mistakes a quality estimator can learn to spot. The difficulty comes from grammar rather than from
vocabulary size:

* subject-object-verb order, postpositions after a genitive, and "because" clauses that move to the
  front of the target sentence;
* seven vowel-harmonic noun cases whose allomorph depends on the stem's last vowel and last sound;
* direct objects that are marked accusative only when definite ("a book" -> ном, "the book" -> номыг);
* numerals and quantifiers that keep the noun singular, a separate plural word нар for people, and
  irregular pronoun paradigms;
* verb suffixes for habitual, past, future and progressive, their negations, and question particles
  that follow harmony;
* thousands of rare person and city names whose Cyrillic spelling has to be transliterated.

A sentence is first sampled as a meaning (``Sentence`` -> ``Clause`` -> ``NP``) and then rendered
independently into both languages, which keeps the two sides consistent and makes the grammar
readable. The target stems are invented (a handful are real Mongolian words); only consistency and
harmony matter. The grammar is a simplified, regular caricature of Khalkha Mongolian, not a
description of it.
"""

from __future__ import annotations

import bisect
import functools
import random
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence, Union

__all__ = [
    "CASES",
    "CORRUPTIONS",
    "Pair",
    "SRC_LANG",
    "TGT_LANG",
    "analyze",
    "attach_case",
    "build_splits",
    "corrupt",
    "generate_pairs",
    "harmony",
    "lexicon",
    "pluralize",
    "question_particle",
    "render",
    "sample_sentence",
    "transliterate",
    "verb_forms",
]

SRC_LANG = "eng_Latn"
TGT_LANG = "khk_Cyrl"

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


@dataclass(frozen=True)
class Pair:
    """One parallel sentence: English source, Tiny Mongolian target."""

    src: str
    tgt: str


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
_FLIP = {"a": "e", "o": "ö", "e": "a", "ö": "o"}

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


def _ending(word: str) -> str:
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
    end = _ending(stem)
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
    end = _ending(form)
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
    if _ending(word) == "long":
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
    s, l = _SHORT[h], _LONG[h]
    vowel_final = stem[-1] in _VOWELS or stem[-1] == "й"
    link = "" if vowel_final else _link_vowel(stem, h)
    inf = stem + link + "х"
    if vowel_final:
        fut = stem + "н" + s
        conv = stem + "ж"
        past_neg = stem + "г" + l + "гүй"
    else:
        fut = stem + (link if _needs_link(stem) else "") + "н" + s
        if _needs_link(stem):
            conv = stem + link + "ж"
        else:
            conv = stem + ("ч" if stem[-1] in "вгрс" else "ж")
        past_neg = stem + l + "гүй"
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


def _verb_words(stem: str, tense: str, neg: bool = False, question: bool = False) -> list:
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


def _copula_words(kind: str, tense: str, neg: bool, question: bool) -> list:
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


def _en_plural(word: str) -> str:
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _en_third(word: str) -> str:
    if word in ("have", "be", "do", "go"):
        return {"have": "has", "be": "is", "do": "does", "go": "goes"}[word]
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _en_ing(word: str) -> str:
    if word in _DOUBLE_FINAL:
        return word + word[-1] + "ing"
    if word.endswith("ie"):
        return word[:-2] + "ying"
    if word.endswith("e") and not word.endswith(("ee", "ye", "oe")):
        return word[:-1] + "ing"
    return word + "ing"


def _en_past(word: str) -> str:
    if word in _DOUBLE_FINAL:
        return word + word[-1] + "ed"
    if word.endswith("e"):
        return word + "d"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ied"
    return word + "ed"


_AN_WORDS = frozenset({"hour", "honest", "heir"})


def _a_an(word: str) -> str:
    w = word.lower()
    if w in _AN_WORDS:
        return "an"
    if w.startswith(("uni", "use", "eu", "one", "uk")):
        return "a"
    return "an" if w[0] in "aeiou" else "a"


# =============================================================================================
# Lexicon
# =============================================================================================


class _Zipf:
    """Weighted sampler over items with fixed weights; one ``rng.random()`` per draw."""

    def __init__(self, items: Sequence, weights: Sequence[float]):
        if not items:
            raise ValueError("empty pool")
        self.items = list(items)
        self.cum = []
        total = 0.0
        for w in weights:
            total += w
            self.cum.append(total)
        self.total = total

    def pick(self, rng: random.Random):
        i = bisect.bisect_right(self.cum, rng.random() * self.total)
        return self.items[min(i, len(self.items) - 1)]


def _zipf_weight(rank: int, s: float = 1.0, offset: float = 1.0) -> float:
    return 1.0 / (rank + offset) ** s


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    tgt: str
    tgt_pl: str  # may be two words ("багш нар"); the case suffix goes on the last one
    group: str
    tags: frozenset
    mass: bool
    prep: str  # English locative preposition when used as a place: in / at / on
    weight: float

    @property
    def animate(self) -> bool:
        return self.group in ("person", "animal")

    def forms(self, plural: bool, case: str) -> list:
        words = (self.tgt_pl if plural else self.tgt).split()
        words[-1] = attach_case(words[-1], case)
        return words


@dataclass(frozen=True)
class Name:
    en: str
    tgt: str
    kind: str  # person | city
    weight: float


@dataclass(frozen=True)
class Pron:
    key: str  # 1sg 2sg 3m 3f 1pl 3pl


@dataclass(frozen=True)
class Adj:
    en: str
    tgt: str
    tgt_anim: str  # the form used with people and animals (e.g. old: хуучин vs хөгшин)
    classes: frozenset
    order: int  # English/target adjective order: opinion < size < quality < age < colour < material
    weight: float

    def tgt_for(self, head) -> str:
        if isinstance(head, Pron) or (isinstance(head, Noun) and head.animate):
            return self.tgt_anim
        if isinstance(head, Name) and head.kind == "person":
            return self.tgt_anim
        return self.tgt


@dataclass(frozen=True)
class Verb:
    en: str  # base form, possibly phrasal ("wake up")
    en_past: str
    tgt: str  # stem
    frame: str  # tr (accusative object) | in | dat | com | abl
    prep: str  # English preposition before the object ("look at"), "" if none
    obj_spec: str
    subj_spec: str
    flags: frozenset
    ins_spec: str
    weight: float

    def _split(self):
        head, _, particle = self.en.partition(" ")
        return head, ([particle] if particle else [])

    def en_third(self) -> list:
        head, rest = self._split()
        return [_en_third(head)] + rest

    def en_ing(self) -> list:
        head, rest = self._split()
        return [_en_ing(head)] + rest

    def en_base(self) -> list:
        return self.en.split()

    def en_pastform(self) -> list:
        return self.en_past.split()


# --- pronouns: English subject/object/possessive and the irregular target paradigm -----------

_PRONOUNS = {
    "1sg": ("I", "me", "my", ("би", "намайг", "миний", "надад", "надаас", "надаар", "надтай")),
    "2sg": ("you", "you", "your", ("чи", "чамайг", "чиний", "чамд", "чамаас", "чамаар", "чамтай")),
    "3m": ("he", "him", "his", ("тэр", "түүнийг", "түүний", "түүнд", "түүнээс", "түүгээр", "түүнтэй")),
    "3f": ("she", "her", "her", ("тэр", "түүнийг", "түүний", "түүнд", "түүнээс", "түүгээр", "түүнтэй")),
    "1pl": ("we", "us", "our", ("бид", "биднийг", "бидний", "бидэнд", "биднээс", "биднээр", "бидэнтэй")),
    "3pl": ("they", "them", "their", ("тэд", "тэднийг", "тэдний", "тэдэнд", "тэднээс", "тэднээр", "тэдэнтэй")),
}
_PRONOUN_WEIGHTS = {"1sg": 22, "2sg": 14, "3m": 18, "3f": 18, "1pl": 12, "3pl": 16}


def _pron_tgt(key: str, case: str) -> str:
    return _PRONOUNS[key][3][CASES.index(case)]


# --- numerals -------------------------------------------------------------------------------

_NUM_EN = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
# Attributive forms: the ones that end in -н before a noun (гурван ном) are the learnable part.
_NUM_TGT = {
    1: "нэг", 2: "хоёр", 3: "гурван", 4: "дөрвөн", 5: "таван", 6: "зургаан",
    7: "долоон", 8: "найман", 9: "есөн", 10: "арван", 20: "хорин",
}


def _num_tgt(n: int, digits: bool) -> list:
    if digits or n > 20:
        return [str(n)]
    if n in _NUM_TGT:
        return [_NUM_TGT[n]]
    return ["арван", _NUM_TGT[n - 10]]


def _num_en(n: int, digits: bool) -> str:
    return str(n) if digits or n > 20 else _NUM_EN[n]


# --- invented target stems ------------------------------------------------------------------

_STEM_ONSETS_FIRST = "б в г д ж з л м н с т х ц ч ш".split() + ["", "", ""]
_STEM_ONSETS_MEDIAL = "б в г д ж з л м н р с т х ц ч ш".split()
_STEM_CODAS = "н л р г д с т х ш м в".split()
_STEM_VOWELS = {  # (first syllable, later syllables) per harmony class
    "a": ("а а у аа уу ай".split(), "а а у и аа".split()),
    "o": ("о о оо ой".split(), "о о у и оо".split()),
    "e": ("э э ү и ээ үү эй".split(), "э э ү и ээ".split()),
    "ö": ("ө ө өө".split(), "ө ө ү и өө".split()),
}


def _invent_stem(rng: random.Random, used: set, final_consonant: float = 0.6) -> str:
    """A new harmonic stem of one to three syllables that is not in ``used``."""
    while True:
        cls = rng.choices(("a", "o", "e", "ö"), weights=(35, 20, 30, 15))[0]
        first, later = _STEM_VOWELS[cls]
        nsyl = rng.choices((1, 2, 3), weights=(3, 5, 2))[0]
        parts = []
        for i in range(nsyl):
            onset = rng.choice(_STEM_ONSETS_FIRST if i == 0 else _STEM_ONSETS_MEDIAL)
            vowel = rng.choice(first if i == 0 else later)
            last = i == nsyl - 1
            coda = ""
            if not vowel.endswith("й"):
                if last and rng.random() < final_consonant:
                    coda = rng.choice(_STEM_CODAS)
                elif not last and rng.random() < 0.3:
                    coda = rng.choice(_STEM_CODAS)
            parts.append(onset + vowel + coda)
        stem = "".join(parts)
        if len(stem) < 2 or stem in used:
            continue
        if nsyl == 1 and _ending(stem) == "short":
            continue
        used.add(stem)
        return stem


# --- nouns ----------------------------------------------------------------------------------
# Each group lists its words from most to least frequent: the rank sets a Zipf weight, so the
# tail of each group is rare. Item syntax: english[/plural][:stem[/plural stem]]; a trailing *
# marks a mass noun (no article "a", no plural, no numerals).

_NOUN_GROUPS = (
    ("person", """
        teacher:багш student:оюутан child/children:хүүхэд/хүүхдүүд friend:найз mother:ээж
        father:аав doctor:эмч sister:эгч brother:ах man/men:эрэгтэй woman/women:эмэгтэй boy:хүү
        girl:охин person/people:хүн/хүмүүс farmer driver worker herder singer writer neighbor
        king queen soldier cook nurse guest baby grandmother grandfather uncle aunt son daughter
        wife/wives husband artist engineer pilot judge merchant hunter fisherman/fishermen
        scientist actor dancer player leader stranger traveler monk waiter baker tailor painter
        poet musician journalist manager secretary guard thief/thieves prince princess shepherd
        officer lawyer"""),
    ("animal", """
        dog:нохой cat:муур horse camel:тэмээ sheep/sheep cow:үхэр bird:шувуу goat
        fish/fish:загас wolf/wolves mouse/mice bear fox eagle rabbit deer/deer yak snake duck
        chicken pig lion tiger monkey elephant frog owl donkey"""),
    ("food", """
        bread*:талх meat*:мах apple:алим rice* soup* cheese* egg cake potato/potatoes carrot
        onion noodle sugar* salt* butter* dumpling fruit banana orange tomato/tomatoes pie cookie
        sandwich candy honey* pear"""),
    ("drink", "water*:ус tea*:цай milk*:сүү coffee* juice* kumis* soda* wine*"),
    ("text", """
        book:ном letter:захиа newspaper:сонин story message poem report magazine list note map
        novel article email textbook dictionary diary menu"""),
    ("thing", """
        cup:аяга knife/knives:хутга money*:мөнгө table:ширээ chair:сандал door:хаалга
        window:цонх pen bag box key phone ball toy bottle plate spoon fork lamp clock watch
        camera computer picture photo gift coin ring rope hammer bucket basket blanket pillow
        mirror umbrella guitar drum candle brush bowl ticket card glass needle saddle comb wallet
        flag stone stick bed roof wall gate wheel pencil"""),
    ("clothes", """
        hat:малгай shoe:гутал coat shirt dress boot jacket scarf/scarves glove sock belt robe"""),
    ("vehicle", """
        car:машин bus:автобус train plane:онгоц bicycle boat truck taxi motorcycle cart ship"""),
    ("building", """
        house:байшин school shop:дэлгүүр market:зах hospital:эмнэлэг city:хот library office
        kitchen garden park room museum restaurant bank station airport factory farm village
        yard street bridge temple theater hotel university classroom cinema stadium zoo bakery
        palace yurt camp castle harbor square prison"""),
    ("nature", """
        mountain:уул river:гол lake:нуур forest desert field sea island beach valley hill
        steppe road"""),
    ("plant", "tree:мод flower:цэцэг grass* bush"),
    ("sky", "sky:тэнгэр sun moon:сар star rain* snow* wind* fire"),
    ("abstract", """
        song:дуу word:үг work*:ажил game film question answer idea problem lesson language
        music* name dream plan holiday festival news* weather* history* math* sound"""),
)

# Extra tags: verbs and adjuncts select nouns by tag or by word.
_NOUN_TAGS = {
    "openable": "door window box bag book bottle gate letter shop",
    "container": "cup bottle bucket basket bowl glass box bag",
    "writeins": "pen pencil computer brush",
    "cutins": "knife",
    "eatins": "spoon fork",
    "fixins": "hammer knife rope",
    "surface": "table chair bed box car tree door window wall stone bridge",
    "part": "door window roof wall gate wheel",
    "plantable": "tree flower",
    "climbable": "mountain tree hill wall",
    "crossable": "river road bridge street desert steppe",
    "drivable": "car bus truck taxi train",
    "ridable": "bicycle motorcycle horse camel donkey yak",
    "livestock": "horse camel sheep goat cow yak",
    "wild": "wolf bear fox eagle rabbit deer snake lion tiger",
    "flyer": "bird eagle duck owl",
    "biter": "dog snake wolf cat mouse",
    "playable": "game guitar drum ball",
    "watchable": "film game",
    "subject": "music history math",
    "storyish": "story news answer",
    "picturelike": "picture photo map",
    "buildable": "house school bridge yurt temple hospital road wall",
    "milkable": "cow camel goat yak",
    "bakeable": "bread cake pie cookie",
    "boilable": "water tea milk egg rice potato",
}
_AT_PLACES = frozenset("school station market airport bank office university factory stadium zoo harbor camp".split())
_ON_PLACES = frozenset("street bridge island farm field beach road square hill mountain steppe".split())
_SUFFIX_PLURAL_PEOPLE = frozenset("child boy girl man woman person baby".split())

def _build_nouns(rng: random.Random, used: set) -> list:
    nouns = []
    seen = set()
    for group, text in _NOUN_GROUPS:
        for rank, item in enumerate(text.split()):
            en_part, _, tgt_part = item.partition(":")
            mass = en_part.endswith("*")
            en_part = en_part.rstrip("*")
            en, _, en_pl = en_part.partition("/")
            tgt, _, tgt_pl = tgt_part.partition("/")
            if en in seen:
                raise AssertionError(f"duplicate noun {en}")
            seen.add(en)
            if not tgt:
                tgt = _invent_stem(rng, used)
            if not tgt_pl:
                if group == "person" and en not in _SUFFIX_PLURAL_PEOPLE:
                    tgt_pl = tgt + " нар"
                else:
                    tgt_pl = pluralize(tgt)
            tags = {group}
            if group in ("building", "nature"):
                tags.add("place")
            if group in ("thing", "clothes", "vehicle", "text"):
                tags.add("object")
            for tag, words in _NOUN_TAGS.items():
                if en in words.split():
                    tags.add(tag)
            prep = "at" if en in _AT_PLACES else "on" if en in _ON_PLACES else "in"
            nouns.append(
                Noun(
                    en=en,
                    en_pl=en if mass else (en_pl or _en_plural(en)),
                    tgt=tgt,
                    tgt_pl=tgt_pl,
                    group=group,
                    tags=frozenset(tags),
                    mass=mass,
                    prep=prep,
                    weight=_zipf_weight(rank),
                )
            )
    return nouns


# --- adjectives -----------------------------------------------------------------------------
# english[:stem[/animate stem]] classes order. Classes: anim, thing, food, place, plant, text,
# abstract, vehicle; "phys" = anim thing food place plant vehicle; "all" = everything.

_ADJECTIVES = """
good:сайн all 1 | big:том phys 2 | small:жижиг phys 2 | old:хуучин/хөгшин thing place vehicle anim text 4
new:шинэ thing place vehicle text 4 | beautiful:сайхан anim thing place plant vehicle 1
young:залуу anim 4 | bad:муу all 1 | red:улаан thing plant vehicle 5 | white:цагаан thing anim plant vehicle 5
long:урт thing text place 3 | tall:өндөр anim plant place 2 | hot:халуун food place 3
cold:хүйтэн food place 3 | happy:баяртай anim 3 | strong:хүчтэй anim 3 | rich:баян anim 3
poor:ядуу anim 3 | clean:цэвэр thing place vehicle 3 | dirty:бохир thing place anim vehicle 3
expensive:үнэтэй thing food vehicle 1 | cheap:хямд thing food vehicle 1 | easy:амархан abstract text 1
difficult:хэцүү abstract text 1 | fast:хурдан anim vehicle 3 | slow:удаан anim vehicle 3
heavy:хүнд thing 3 | tired:ядарсан anim 3 | hungry:өлсгөлөн anim 3 | kind:эелдэг anim 1
black thing anim vehicle 5 | yellow:шар thing plant 5 | blue:цэнхэр thing vehicle 5 | green:ногоон thing plant 5
brown thing anim 5 | gray thing anim 5 | pink thing plant 5 | short thing text anim 2
light thing 3 | warm food place thing 3 | fresh food plant 3 | sweet food 3 | delicious food 1
dry food plant place 3 | wet thing anim place 3 | soft thing food 3 | hard thing food 3
sad anim 3 | angry anim 3 | thirsty anim 3 | sick anim 3 | clever anim 1 | brave anim 1
lazy anim 1 | busy anim place 3 | famous anim place text 1 | weak anim 3 | friendly anim 1
honest anim 1 | proud anim 1 | quiet place anim 3 | loud place anim 3 | empty thing place vehicle 3
full thing place vehicle 3 | round thing 3 | sharp thing 3 | wooden thing 6 | golden thing 6
broken thing vehicle 3 | dark place thing 3 | bright place thing 3 | wide place 2 | narrow place 2
deep place 2 | high place 2 | interesting text abstract 1 | boring text abstract 1
important text abstract 1 | simple abstract text thing 1 | strange all 1 | funny text abstract anim 1
huge phys 2 | tiny phys 2 | little phys 2 | lovely phys 1 | dangerous anim place 1
useful thing 1 | ugly anim thing 1 | wild anim 3 | smart anim 1 | silver thing 6
"""
_ADJ_CLASS_OF_GROUP = {
    "person": "anim", "animal": "anim", "food": "food", "drink": "food", "text": "text",
    "thing": "thing", "clothes": "thing", "vehicle": "vehicle", "building": "place",
    "nature": "place", "plant": "plant", "sky": "sky", "abstract": "abstract",
}


def _build_adjectives(rng: random.Random, used: set) -> list:
    adjs = []
    entries = [e.split() for e in _ADJECTIVES.replace("\n", "|").split("|") if e.strip()]
    for rank, fields in enumerate(entries):
        head, classes, order = fields[0], fields[1:-1], int(fields[-1])
        en, _, stems = head.partition(":")
        tgt, _, tgt_anim = stems.partition("/")
        if not tgt:
            tgt = _invent_stem(rng, used)
        cls = set()
        for c in classes:
            if c == "phys":
                cls |= {"anim", "thing", "food", "place", "plant", "vehicle"}
            elif c == "all":
                cls |= set(_ADJ_CLASS_OF_GROUP.values())
            else:
                cls.add(c)
        adjs.append(Adj(en, tgt, tgt_anim or tgt, frozenset(cls), order, _zipf_weight(rank, 0.8)))
    return adjs


# --- verbs ----------------------------------------------------------------------------------
# base | past (blank: regular) | frame | English object preposition | object spec | flags | stem
# Frames give the target case of the object: tr accusative (only if definite), dat, com, abl.
# Flags: opt (object may be left out), anim (animals may be subjects), subj=SPEC, mot (motion:
# to/from/by adjuncts), arrive, needloc, rcp (recipient "to X" -> dative), rcpfor ("for X"), ask
# (recipient in the ablative: "ask the teacher a question"), src (from-adjunct), pp (on/under..
# adjuncts), ins=SPEC (instrument "with a knife"), stative (no progressive), cityobj.

_VERBS = """
read|read|tr||text|opt|унш
write|wrote|tr||text|opt rcp ins=writeins|бич
go|went|in|||mot|яв
come|came|in|||mot|ир
eat|ate|tr||food|opt anim ins=eatins|ид
drink|drank|tr||drink|opt anim|уу
see|saw|tr||person animal vehicle building nature plant object|anim stative cityobj|
look|looked|dat|at|person animal object plant sky|anim|хар
give|gave|tr||object food animal|rcp|өг
buy|bought|tr||food drink object animal|src rcpfor|
listen|listened|dat|to|song music person news sound|anim|сонс
make|made|tr||food thing|rcpfor|хий
sleep|slept|in|||anim pp|унт
work||in|||pp|ажилла
play||tr||playable|opt|тогло
play||com|with|person animal|anim|тогло
help||dat||person animal||тусал
like||tr||person animal food drink object song game film subject|stative anim|
want||tr||food drink object animal|stative anim|
take|took|tr||object food|src|ав
bring|brought|tr||object food drink|rcp src|авчир
sit|sat|in|||anim pp|суу
walk||in|||mot anim|алх
run|ran|in|||mot anim|гүй
learn||tr||subject song word language|opt src|сур
teach|taught|tr||subject song language|rcp|заа
know|knew|tr||person language|stative|мэд
find|found|tr||object animal|src pp|ол
call||tr||person||дууд
meet|met|com||person||уулз
talk||com|with|person||
sing|sang|tr||song|opt subj=person flyer|дуул
cook||tr||food|opt rcpfor|чана
wash||tr||thing clothes vehicle animal||угаа
open||tr||openable||нээ
close||tr||openable||хаа
sell|sold|tr||food object livestock|rcp|зар
ask||tr||question|ask|асуу
answer||tr||question||хариул
wait||tr|for|person vehicle||хүлээ
send|sent|tr||text thing|rcp|явуул
visit||tr||person building|cityobj|
need||tr||object food|stative|
love||tr||person animal|stative|
travel||in|||mot|
return||in|||mot|
fly|flew|in|||mot subj=flyer person|нис
arrive||in|||arrive|
swim|swam|in|||anim|сэл
stand|stood|in|||anim pp|зогс
build|built|tr||buildable||
draw|drew|tr||person animal building nature plant thing|opt ins=writeins|зур
cut|cut|tr||food rope|ins=cutins|огтол
study||tr||subject language|opt|
tell|told|tr||storyish|rcp|
show||tr||picturelike thing text|rcp|
lend|lent|tr||thing text|rcp|
borrow||tr||thing text|src|
receive||tr||text thing|src|
steal|stole|tr||thing animal|src|
hide|hid|tr||thing|pp|
keep|kept|tr||thing animal|pp stative|
feed|fed|tr||animal||
count||tr||money animal thing||
check||tr||text thing vehicle||
follow||tr||person animal vehicle|anim|
forget|forgot|tr||thing word name|stative|
remember||tr||person word story name|stative|
choose|chose|tr||thing clothes food text||
win|won|tr||game||
plant||tr||plantable||
climb||tr||climbable|anim|
cross||tr||crossable|anim|
drive|drove|tr||drivable|mot|
ride|rode|tr||ridable|mot|
fill||tr||container||
break|broke|tr||thing||
hunt||tr||wild|subj=person wild|
protect||tr||person animal building||
smile||dat|at|person||
fight|fought|com|with|person animal|anim|
argue||com|with|person||
agree||com|with|person|stative|
marry||com||person||
fear||abl||animal person|stative anim|ай
escape||abl|from|person animal building|anim|
leave|left|abl||building|cityobj|гар
enter||dat||building||ор
cry||in|||pp|уйл
laugh||in|||pp|инээ
shout||in||||
jump||in|||anim pp|үсэр
rest||in|||anim pp|амар
dance||in||||
live||in|||needloc anim stative|
stay||in|||needloc|
wake up|woke up|in|||anim|сэр
get up|got up|in|||anim|бос
look for|looked for|tr||person animal object|anim|хай
pick up|picked up|tr||thing text||
clean||tr||building thing vehicle||
paint||tr||building thing|opt ins=writeins|
fix||tr||thing vehicle|ins=fixins|зас
catch|caught|tr||animal ball|anim|бар
hold|held|tr||thing animal||
throw|threw|tr||ball stone|rcp|шид
kick||tr||ball|subj=person livestock|
push||tr||vehicle thing||
pull||tr||cart rope||
wear|wore|tr||clothes||
carry||tr||thing food animal|subj=person livestock|
watch||tr||watchable animal person||
hear|heard|tr||song person animal music news sound|anim stative|
pay|paid|tr||money|rcp|төл
order||tr||food drink||
prepare||tr||food|rcpfor|бэлд
boil||tr||boilable||
bake||tr||bakeable|rcpfor|
taste||tr||food drink||
smell||tr||food plant|anim|
touch||tr||animal thing||
move||tr||thing||
save||tr||person animal money||
collect||tr||thing||
pray||in|||pp|
graze||in|||subj=livestock|
bark||in|||subj=dog|
bite|bit|tr||person animal|subj=biter|
milk||tr||milkable||саа
begin|began|tr||lesson work game||
finish||tr||work lesson text game food||
explain||tr||question answer idea problem|rcp|
solve||tr||problem question||
understand|understood|tr||question answer language idea person|stative|ойлго
believe||dat||person story|stative|итгэ
thank||dat||person||
forgive|forgave|tr||person||
greet||tr||person||
grow|grew|tr||plantable food||
sew|sewed|tr||clothes|rcpfor|
drop||tr||thing||
lift||tr||thing animal||
"""


def _build_verbs(rng: random.Random, used: set) -> list:
    verbs = []
    stems = {}
    for rank, line in enumerate(x for x in _VERBS.strip().splitlines() if x.strip()):
        base, past, frame, prep, obj, flags, stem = (f.strip() for f in line.split("|"))
        flagset = set(flags.split())
        subj = "person"
        ins = ""
        for f in list(flagset):
            if f.startswith("subj="):
                subj = f[5:].replace(",", " ")
                flagset.discard(f)
            elif f.startswith("ins="):
                ins = f[4:]
                flagset.discard(f)
        if subj == "person" and "anim" in flagset:
            subj = "person animal"
        if not stem:
            # Two entries of one English verb (play a game / play with) share one stem.
            stem = stems.get(base) or _invent_stem(rng, used, final_consonant=0.9)
        stems[base] = stem
        head, _, particle = base.partition(" ")
        if not past:
            past = " ".join([_en_past(head)] + ([particle] if particle else []))
        verbs.append(
            Verb(base, past, stem, frame, prep, obj, subj, frozenset(flagset), ins, _zipf_weight(rank, 0.9))
        )
    return verbs


# --- adverbs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeAdv:
    en: str
    tgt: str
    tenses: frozenset
    pre: bool  # frequency adverbs stand before the English verb ("he often reads")


_ANY_TENSE = "pres past fut prog pprog"
_TIME_ADVERBS = [
    ("yesterday", "өчигдөр", "past pprog"),
    ("tomorrow", "маргааш", "fut"),
    ("today", "өнөөдөр", "past fut prog"),
    ("in the morning", "өглөө", _ANY_TENSE),
    ("in the evening", "орой", _ANY_TENSE),
    ("every day", "өдөр бүр", "pres"),
    ("now", "одоо", "prog"),
    ("often", "байнга", "pres"),
    ("always", "үргэлж", "pres"),
    ("at night", "шөнө", _ANY_TENSE),
    ("last year", "өнгөрсөн жил", "past"),
    ("next week", "ирэх долоо хоногт", "fut"),
    ("sometimes", "заримдаа", "pres"),
    ("usually", "ихэвчлэн", "pres"),
    ("soon", "удахгүй", "fut"),
    ("last week", "өнгөрсөн долоо хоногт", "past"),
    ("right now", "яг одоо", "prog"),
    ("every morning", "өглөө бүр", "pres"),
    ("next year", "ирэх жил", "fut"),
    ("last night", "өчигдөр шөнө", "past pprog"),
    ("in winter", "өвөл", "pres past fut"),
    ("in summer", "зун", "pres past fut"),
    ("in spring", "хавар", "pres past fut"),
    ("in autumn", "намар", "pres past fut"),
    ("every week", "долоо хоног бүр", "pres"),
    ("on Monday", "даваа гарагт", "past fut"),
    ("on Tuesday", "мягмар гарагт", "past fut"),
    ("on Wednesday", "лхагва гарагт", "past fut"),
    ("on Thursday", "пүрэв гарагт", "past fut"),
    ("on Friday", "баасан гарагт", "past fut"),
    ("on Saturday", "бямба гарагт", "past fut"),
    ("on Sunday", "ням гарагт", "past fut"),
]
_PRE_ADVERBS = frozenset({"often", "always", "sometimes", "usually"})
# Templates with a number: English, target (number goes where {n} is), tenses.
_TIME_TEMPLATES = [
    ("{n} days ago", "{n} хоногийн өмнө", "past", (2, 12)),
    ("{n} years ago", "{n} жилийн өмнө", "past", (2, 30)),
    ("at {n} o'clock", "{n} цагт", "pres past fut", (1, 12)),
    ("in {n} days", "{n} хоногийн дараа", "fut", (2, 12)),
]
_MANNER = [
    ("quickly", "хурдан"), ("slowly", "удаан"), ("carefully", "болгоомжтой"), ("quietly", "чимээгүй"),
    ("well", "сайн"), ("again", "дахин"), ("together", "хамтдаа"), ("loudly", "чанга"),
    ("early", "эрт"), ("happily", "баяртай"), ("alone", "ганцаараа"), ("late", "оройтож"),
]

# Postpositions after a genitive, for locations relative to things.
_POSTPOSITIONS = {"on": "дээр", "under": "доор", "near": "дэргэд", "behind": "ард", "in front of": "өмнө"}
_DET_TGT = {"this": "энэ", "that": "тэр", "these": "эдгээр", "those": "тэдгээр", "all": "бүх", "many": "олон"}
_CONJ_TGT = {"and": "ба", "but": "гэвч"}
_AUX_WORDS = frozenset({"байна", "байсан", "байх", "болно", "биш", "байхгүй", "байгаагүй"})
_PARTICLES = frozenset({"уу", "үү", "юу", "юү"})
_FUNCTION_WORDS = frozenset(
    {"ба", "гэвч", "учраас", "бол", "бүр", "бүх", "олон", "хэдэн", "жаахан", "хамт", "энэ", "эдгээр",
     "тэдгээр"}
    | set(_POSTPOSITIONS.values())
)


# --- names ----------------------------------------------------------------------------------

_EN_FUNCTION_WORDS = (
    "a an the and but because is are was were will be not do does did to from in at on by with of "
    "for there this that these those every all many some no i me my you your he him his she her we "
    "us our they them their am".split()
)

_TRANSLIT = sorted(
    {
        "kh": "х", "ch": "ч", "sh": "ш", "ts": "ц", "zh": "ж", "ya": "я", "yo": "ё", "yu": "ю",
        "ye": "е", "oe": "ө", "ue": "ү", "ii": "ий", "ai": "ай", "ei": "эй", "oi": "ой", "ui": "уй",
        "a": "а", "b": "б", "c": "к", "d": "д", "e": "э", "f": "ф", "g": "г", "h": "х", "i": "и",
        "j": "ж", "k": "к", "l": "л", "m": "м", "n": "н", "o": "о", "p": "п", "q": "к", "r": "р",
        "s": "с", "t": "т", "u": "у", "v": "в", "w": "в", "x": "кс", "y": "й", "z": "з",
    }.items(),
    key=lambda kv: -len(kv[0]),
)


def transliterate(latin: str) -> str:
    """Latin name -> Cyrillic, greedy longest match (kh=х, ts=ц, oe=ө, ue=ү, ya=я, ...).

    Deterministic and letter-based, so a model can learn it from the names it sees and apply it to
    the many names it has never seen.
    """
    low = latin.lower()
    out = []
    i = 0
    while i < len(low):
        for lat, cyr in _TRANSLIT:
            if low.startswith(lat, i):
                out.append(cyr)
                i += len(lat)
                break
        else:
            out.append(low[i])
            i += 1
    s = "".join(out)
    return s[:1].upper() + s[1:]


_MN_ONSETS_FIRST = "b ch d g j kh l m n s sh t ts z y".split() + ["", ""]
_MN_ONSETS_MEDIAL = "b ch d g j kh l m n r s sh t ts z".split()
_MN_VOWELS = {"back": "a a o u aa oo uu ai".split(), "front": "e e i oe ue ee ii ei".split()}
_MN_CODAS = "n l r g d s t m kh b ng".split()
_WEST_ONSETS = "b d f g k l m n p r s t v w z".split() + [""]
_WEST_VOWELS = "a e i o u a e i o".split()
_WEST_CODAS = "n l r s t m k".split()
_MN_CITY_ENDINGS = "khot bulag tal gol nuur khan uul tolgoi ovoo sum khoshuu".split()
_WEST_CITY_ENDINGS = "ton ville burg ford port field mont stad berg dale".split()
_DIGRAPHS = ("kh", "ch", "sh", "ts", "zh", "oe", "ue", "ii", "ai", "ei", "oi", "ui", "ya", "yo", "yu", "ye")


def _mn_syllables(rng: random.Random, n: int) -> str:
    vowels = _MN_VOWELS["back" if rng.random() < 0.6 else "front"]
    parts = []
    for i in range(n):
        onset = rng.choice(_MN_ONSETS_FIRST if i == 0 else _MN_ONSETS_MEDIAL)
        vowel = rng.choice(vowels)
        if onset == "y" and vowel[0] not in "aou":
            onset = "b"
        last = i == n - 1
        coda = ""
        if rng.random() < (0.55 if last else 0.35):
            coda = rng.choice(_MN_CODAS)
            if i + 1 < n and coda == "t":
                coda = "d"
        parts.append(onset + vowel + coda)
    return "".join(parts)


def _west_syllables(rng: random.Random, n: int) -> str:
    parts = []
    for i in range(n):
        onset = rng.choice(_WEST_ONSETS) if i == 0 else rng.choice(_WEST_ONSETS[:-1])
        coda = rng.choice(_WEST_CODAS) if rng.random() < 0.35 else ""
        parts.append(onset + rng.choice(_WEST_VOWELS) + coda)
    return "".join(parts)


def _build_names(rng: random.Random, kind: str, n: int, taken: set) -> list:
    """``n`` unique names in Zipf order; most of the pool is rare, so names must be transliterated."""
    names = []
    taken_cyr = set()
    while len(names) < n:
        west = rng.random() < 0.3
        if kind == "person":
            nsyl = rng.choices((1, 2, 3), weights=(1, 6, 3))[0]
            latin = _west_syllables(rng, nsyl) if west else _mn_syllables(rng, nsyl)
            if west and rng.random() < 0.4:
                latin += rng.choice(("a", "o", "an", "el", "en", "ina", "son"))
        else:
            root = _west_syllables(rng, rng.choice((1, 2))) if west else _mn_syllables(rng, rng.choice((1, 2)))
            latin = root + rng.choice(_WEST_CITY_ENDINGS if west else _MN_CITY_ENDINGS)
        if west and any(d in latin for d in _DIGRAPHS):
            continue
        if not 3 <= len(latin) <= 14 or latin in taken:
            continue
        latin = latin[0].upper() + latin[1:]
        cyr = transliterate(latin)
        if cyr in taken_cyr or latin.lower() in taken:
            continue
        taken.add(latin.lower())
        taken_cyr.add(cyr)
        names.append(Name(latin, cyr, kind, _zipf_weight(len(names), 0.95, 3.0)))
    return names


# --- the world (built once, from fixed seeds, independent of any sampling seed) --------------


class _World:
    def __init__(self) -> None:
        used = set()
        # Real words first so invented stems never collide with them.
        for _, text in _NOUN_GROUPS:
            for item in text.split():
                tgt = item.partition(":")[2]
                used.update(t for t in tgt.split("/") if t)
        for e in _ADJECTIVES.replace("\n", "|").split("|"):
            stems = e.split()[0].partition(":")[2] if e.strip() else ""
            used.update(s for s in stems.split("/") if s)
        for line in _VERBS.strip().splitlines():
            stem = line.split("|")[-1].strip()
            if stem:
                used.add(stem)
        for words in (_NUM_TGT.values(), _AUX_WORDS, _PARTICLES, _FUNCTION_WORDS):
            used.update(words)
        used.update(w for _, t, _ in _TIME_ADVERBS for w in t.split())
        used.update(t for _, t in _MANNER)
        used.update(f for p in _PRONOUNS.values() for f in p[3])
        used.add("нар")  # the human plural word
        rng = random.Random("tinyworld-lexicon-v1")
        self.nouns = _build_nouns(rng, used)
        self.adjs = _build_adjectives(rng, used)
        self.verbs = _build_verbs(rng, used)
        self.noun = {n.en: n for n in self.nouns}
        self.adj = {a.en: a for a in self.adjs}
        self.verb = {}
        for v in self.verbs:
            self.verb.setdefault(v.en, v)
        # Names must not read as English words of the world ("Ten", "Met", "Sun").
        taken = set(_NUM_EN) | set(_EN_FUNCTION_WORDS)
        for n in self.nouns:
            taken |= {n.en, n.en_pl}
        for a in self.adjs:
            taken.add(a.en)
        for v in self.verbs:
            taken |= {v.en, v.en_past, _en_third(v.en), _en_ing(v.en)}
        names_rng = random.Random("tinyworld-names-v1")
        self.people = _build_names(names_rng, "person", 4000, taken)
        self.cities = _build_names(names_rng, "city", 1200, taken)
        self.people_pool = _Zipf(self.people, [n.weight for n in self.people])
        self.city_pool = _Zipf(self.cities, [n.weight for n in self.cities])
        self.verb_pool = _Zipf(self.verbs, [v.weight for v in self.verbs])
        self.time_pool = _Zipf(_TIME_ADVERBS, [_zipf_weight(r, 0.8) for r in range(len(_TIME_ADVERBS))])
        self._noun_pools: dict = {}
        self._adj_pools: dict = {}
        for v in self.verbs:  # fail at import, not mid-sampling, on a typo in the tables
            for spec in (v.obj_spec, v.subj_spec, v.ins_spec):
                if spec and not self.nouns_for(spec):
                    raise AssertionError(f"verb {v.en}: no noun matches {spec!r}")

    def nouns_for(self, spec: str) -> list:
        keys = set(spec.split())
        return [n for n in self.nouns if n.en in keys or n.tags & keys]

    def noun_pool(self, spec: str) -> _Zipf:
        pool = self._noun_pools.get(spec)
        if pool is None:
            items = self.nouns_for(spec)
            pool = self._noun_pools[spec] = _Zipf(items, [n.weight for n in items])
        return pool

    def adj_pool(self, cls: str) -> Optional[_Zipf]:
        if cls not in self._adj_pools:
            items = [a for a in self.adjs if cls in a.classes]
            self._adj_pools[cls] = _Zipf(items, [a.weight for a in items]) if items else None
        return self._adj_pools[cls]


@functools.lru_cache(maxsize=1)
def _world() -> _World:
    return _World()


def lexicon() -> _World:
    """The fixed lexicon: ``.noun``/``.verb``/``.adj`` dicts by English word, ``.people``, ``.cities``.

    It is built from constant seeds, so it is the same for every sampling seed and every run.
    """
    return _world()


# =============================================================================================
# Meaning representation
# =============================================================================================

Head = Union[Noun, Name, Pron]


@dataclass(frozen=True)
class NP:
    """A noun phrase. ``det``: the a bare this that these those every all many some count no poss."""

    head: Head
    det: str = "the"
    plural: bool = False
    count: int = 0
    digits: bool = False
    adjs: tuple = ()
    poss: Optional["NP"] = None
    poss_of: bool = False  # English "the door of the house" instead of "the house's door"

    @property
    def definite(self) -> bool:
        if not isinstance(self.head, Noun):
            return True
        return self.poss is not None or self.det in ("the", "this", "that", "these", "those", "all", "poss")


@dataclass(frozen=True)
class Adjunct:
    role: str  # loc dest src pp com comt ins veh
    np: NP
    prep: str  # English preposition


@dataclass(frozen=True)
class Clause:
    kind: str  # act | cop_adj | cop_noun | cop_loc | exist
    subj: NP
    tense: str = "pres"
    neg: bool = False
    verb: Optional[Verb] = None
    obj: Optional[NP] = None
    rcp: Optional[NP] = None
    rcp_shift: bool = False  # English "give the teacher a book"
    adjuncts: tuple = ()
    pred: object = None  # Adj (cop_adj) or NP (cop_noun)
    loc: Optional[Adjunct] = None  # cop_loc / exist
    time: Optional[TimeAdv] = None
    time_front: bool = False
    manner: Optional[tuple] = None
    contract: bool = False


@dataclass(frozen=True)
class Sentence:
    clauses: tuple
    conj: str = ""  # "" | and_same | and | but | because
    question: bool = False


# =============================================================================================
# Rendering: English
# =============================================================================================


def _en_np(np: NP, role: str = "obj") -> list:
    """English words of a noun phrase; ``role`` is subj, obj or poss (possessor)."""
    h = np.head
    if isinstance(h, Pron):
        subj, obj, poss, _ = _PRONOUNS[h.key]
        return [{"subj": subj, "obj": obj, "poss": poss}[role]]
    if isinstance(h, Name):
        return [h.en + "'s"] if role == "poss" else [h.en]
    core = [a.en for a in np.adjs] + [h.en_pl if np.plural else h.en]
    if np.poss is not None:
        if np.poss_of:
            words = ["the"] + core + ["of"] + _en_np(np.poss, "obj")
        else:
            words = _en_np(np.poss, "poss") + core
    elif np.det == "a":
        words = [_a_an(core[0])] + core
    elif np.det == "bare":
        words = core
    elif np.det == "count":
        words = [_num_en(np.count, np.digits)] + core
    elif np.det == "all":
        words = ["all", "the"] + core
    else:
        words = [np.det] + core
    if role == "poss":
        last = words[-1]
        words[-1] = last + ("'" if np.plural and last.endswith("s") else "'s")
    return words


def _person(np: NP) -> str:
    h = np.head
    if isinstance(h, Pron):
        return {"1sg": "1sg", "2sg": "pl", "3m": "3sg", "3f": "3sg"}.get(h.key, "pl")
    return "pl" if np.plural else "3sg"


_CONTRACTIONS = {
    ("does", "not"): "doesn't", ("do", "not"): "don't", ("did", "not"): "didn't", ("will", "not"): "won't",
    ("is", "not"): "isn't", ("are", "not"): "aren't", ("was", "not"): "wasn't", ("were", "not"): "weren't",
}


def _neg(aux: str, contract: bool) -> list:
    if contract and (aux, "not") in _CONTRACTIONS:
        return [_CONTRACTIONS[aux, "not"]]
    return [aux, "not"]


def _be(tense: str, person: str) -> str:
    if tense in ("pres", "prog"):
        return {"1sg": "am", "3sg": "is"}.get(person, "are")
    return "were" if person == "pl" else "was"


def _en_verb_group(verb: Optional[Verb], tense: str, neg: bool, person: str, contract: bool,
                   question: bool) -> tuple:
    """(question auxiliary, words after the subject). ``verb`` None means the copula "be"."""
    if verb is None:
        if tense == "fut":
            if question:
                return "will", ["be"]
            return None, (_neg("will", contract) if neg else ["will"]) + ["be"]
        be = _be(tense, person)
        if question:
            return be, []
        return None, _neg(be, contract) if neg else [be]
    if tense in ("pres", "past"):
        aux = "did" if tense == "past" else ("does" if person == "3sg" else "do")
        if question:
            return aux, verb.en_base()
        if neg:
            return None, _neg(aux, contract) + verb.en_base()
        if tense == "past":
            return None, verb.en_pastform()
        return None, verb.en_third() if person == "3sg" else verb.en_base()
    if tense == "fut":
        if question:
            return "will", verb.en_base()
        return None, (_neg("will", contract) if neg else ["will"]) + verb.en_base()
    be = _be("pres" if tense == "prog" else "past", person)
    if question:
        return be, verb.en_ing()
    return None, (_neg(be, contract) if neg else [be]) + verb.en_ing()


def _en_adjunct(a: Adjunct) -> list:
    if a.role == "veh":
        return ["by", a.np.head.en]
    return a.prep.split() + _en_np(a.np, "obj")


def _en_clause(cl: Clause, question: bool = False, elide_subj: bool = False) -> list:
    person = _person(cl.subj)
    pre = [cl.time.en] if cl.time and cl.time.pre else []
    if cl.kind == "exist":
        # "there" + be agreeing with the noun; negation is "no" in the noun phrase.
        aux, vwords = _en_verb_group(None, cl.tense, False, person, cl.contract, question)
        subj = ["there"]
        comps = _en_np(cl.subj, "obj") + _en_adjunct(cl.loc)
    else:
        subj = [] if elide_subj else _en_np(cl.subj, "subj")
        aux, vwords = _en_verb_group(cl.verb, cl.tense, cl.neg, person, cl.contract, question)
        if cl.kind == "act":
            comps = _en_complements(cl)
        elif cl.kind == "cop_adj":
            comps = [cl.pred.en]
        elif cl.kind == "cop_noun":
            comps = _en_np(cl.pred, "obj")
        else:
            comps = _en_adjunct(cl.loc)
    if question:
        words = [aux] + subj + pre + vwords + comps
    elif pre and cl.tense == "pres" and not cl.neg and cl.kind == "act":
        words = subj + pre + vwords + comps
    else:
        words = subj + vwords + pre + comps
    if cl.time and not cl.time.pre:
        if cl.time_front and not question:
            words = cl.time.en.split() + [","] + words
        else:
            words = words + cl.time.en.split()
    return words


def _en_complements(cl: Clause) -> list:
    verb = cl.verb
    obj = []
    if cl.obj is not None:
        obj = ([verb.prep] if verb.prep else []) + _en_np(cl.obj, "obj")
    if cl.rcp is not None:
        rcp = _en_np(cl.rcp, "obj")
        if "ask" in verb.flags or (cl.rcp_shift and cl.obj is not None):
            words = rcp + obj
        else:
            words = obj + ["for" if "rcpfor" in verb.flags else "to"] + rcp
    else:
        words = obj
    if cl.manner:
        words = words + [cl.manner[0]]
    for a in cl.adjuncts:
        words = words + _en_adjunct(a)
    return words


# =============================================================================================
# Rendering: target
# =============================================================================================

_ADJUNCT_ORDER = {"src": 0, "dest": 1, "loc": 2, "pp": 3, "com": 4, "comt": 5, "ins": 6, "veh": 7}


def _tgt_np(np: NP, case: str, mark_plural: bool = True) -> list:
    """Target words: possessor-GEN, determiner/numeral, adjectives, head with the case suffix."""
    h = np.head
    if isinstance(h, Pron):
        return [_pron_tgt(h.key, case)]
    if isinstance(h, Name):
        return [attach_case(h.tgt, case)]
    words = []
    if np.poss is not None:
        words += _tgt_np(np.poss, "gen")
    det = np.det
    if det == "some":
        words.append("жаахан" if h.mass else "хэдэн")
    elif det in _DET_TGT:
        words.append(_DET_TGT[det])
    elif det == "count":
        words += _num_tgt(np.count, np.digits)
    words += [a.tgt_for(h) for a in np.adjs]
    # Numerals and quantifiers keep the noun singular; so does a negated existential.
    plural = np.plural and mark_plural and det not in ("count", "many", "some", "every", "no")
    words += h.forms(plural, case)
    if det == "every":
        words.append("бүр")
    return words


def _tgt_adjunct(a: Adjunct) -> list:
    if a.role in ("loc", "dest"):
        return _tgt_np(a.np, "dat")
    if a.role == "src":
        return _tgt_np(a.np, "abl")
    if a.role == "pp":
        return _tgt_np(a.np, "gen") + [_POSTPOSITIONS[a.prep]]
    if a.role == "com":
        return _tgt_np(a.np, "com")
    if a.role == "comt":
        return _tgt_np(a.np, "com") + ["хамт"]
    return _tgt_np(a.np, "ins")  # ins, veh


def _tgt_object(verb: Verb, obj: NP) -> list:
    if verb.frame == "tr":
        # Only a definite direct object is marked; an indefinite one is a bare singular.
        if obj.definite:
            return _tgt_np(obj, "acc")
        return _tgt_np(obj, "nom", mark_plural=False)
    return _tgt_np(obj, verb.frame)


def _tgt_clause(cl: Clause, question: bool = False, mode: str = "final", elide_subj: bool = False) -> list:
    """Target words in SOV order: subject, time, adjuncts, recipient, object, manner, verb."""
    time = cl.time.tgt.split() if cl.time else []
    if cl.kind == "exist":
        words = time + _tgt_adjunct(cl.loc) + _tgt_np(cl.subj, "nom")
        words += _copula_words(cl.kind, cl.tense, cl.neg, question)
    else:
        words = ([] if elide_subj else _tgt_np(cl.subj, "nom")) + time
        if cl.kind == "act":
            for a in sorted(cl.adjuncts, key=lambda a: _ADJUNCT_ORDER[a.role]):
                words += _tgt_adjunct(a)
            if cl.rcp is not None:
                words += _tgt_np(cl.rcp, "abl" if "ask" in cl.verb.flags else "dat")
            if cl.obj is not None:
                words += _tgt_object(cl.verb, cl.obj)
            if cl.manner:
                words.append(cl.manner[1])
            if mode == "converb":
                words.append(verb_forms(cl.verb.tgt)["conv"])
            else:
                words += _verb_words(cl.verb.tgt, cl.tense, cl.neg, question)
        elif cl.kind == "cop_adj":
            words.append(cl.pred.tgt_for(cl.subj.head))
            words += _copula_words(cl.kind, cl.tense, cl.neg, question)
        elif cl.kind == "cop_noun":
            words += ["бол"] + _tgt_np(cl.pred, "nom")
            words += _copula_words(cl.kind, cl.tense, cl.neg, question)
        else:
            words += _tgt_adjunct(cl.loc) + _copula_words(cl.kind, cl.tense, cl.neg, question)
    if question:
        words.append(question_particle(words[-1]))
    if mode == "because":
        words.append("учраас")
    return words


def _detok(words: list, final: str = "") -> str:
    s = " ".join(words).replace(" ,", ",")
    return (s[:1].upper() + s[1:] + final) if s else final


def render(sentence: Sentence) -> Pair:
    """Render a meaning into both languages."""
    c = sentence.clauses
    q = sentence.question
    if len(c) == 1:
        en, tgt = _en_clause(c[0], q), _tgt_clause(c[0], q)
    elif sentence.conj == "and_same":
        en = _en_clause(c[0]) + ["and"] + _en_clause(c[1], elide_subj=True)
        tgt = _tgt_clause(c[0], mode="converb") + [","] + _tgt_clause(c[1], elide_subj=True)
    elif sentence.conj == "because":
        en = _en_clause(c[0]) + ["because"] + _en_clause(c[1])
        tgt = _tgt_clause(c[1], mode="because") + _tgt_clause(c[0])
    else:
        en = _en_clause(c[0]) + [",", sentence.conj] + _en_clause(c[1])
        tgt = _tgt_clause(c[0]) + [",", _CONJ_TGT[sentence.conj]] + _tgt_clause(c[1])
    end = "?" if q else "."
    return Pair(_detok(en, end), _detok(tgt, end))


# =============================================================================================
# Sampling meanings
# =============================================================================================

_DET_WEIGHTS = {
    "subj": (("the", 40), ("poss", 14), ("possnp", 7), ("this", 5), ("that", 4), ("a", 9), ("count", 8),
             ("every", 3), ("all", 3), ("many", 4), ("some", 3)),
    "obj": (("the", 30), ("a", 24), ("poss", 14), ("possnp", 6), ("this", 4), ("that", 3), ("count", 11),
            ("many", 4), ("some", 4)),
    "adj": (("the", 46), ("poss", 18), ("possnp", 6), ("a", 14), ("this", 4), ("that", 3), ("count", 6)),
    "exist": (("a", 50), ("count", 28), ("many", 11), ("some", 11)),
    "possnp": (("the", 70), ("poss", 30)),
    "pred": (("a", 1),),
}


def _choice_w(rng: random.Random, pairs) -> str:
    total = sum(w for _, w in pairs)
    x = rng.random() * total
    for item, w in pairs:
        x -= w
        if x < 0:
            return item
    return pairs[-1][0]


def _sample_count(rng: random.Random) -> tuple:
    r = rng.random()
    if r < 0.05:
        return 1, False
    if r < 0.72:
        n = rng.randint(2, 10)
    elif r < 0.86:
        n = rng.randint(11, 20)
    else:
        return rng.choice((rng.randint(21, 99), rng.randint(100, 999), rng.randint(21, 60))), True
    return n, rng.random() < 0.45


def _sample_adjs(rng: random.Random, noun: Noun, p_one: float = 0.28, p_two: float = 0.05) -> tuple:
    pool = _world().adj_pool(_ADJ_CLASS_OF_GROUP[noun.group])
    if pool is None:
        return ()
    r = rng.random()
    n = 2 if r < p_two else 1 if r < p_one + p_two else 0
    adjs = []
    for _ in range(n):
        a = pool.pick(rng)
        if all(a.order != b.order for b in adjs):  # "a big red ball", never "a bad good ball"
            adjs.append(a)
    return tuple(sorted(adjs, key=lambda a: a.order))


def _sample_pronoun(rng: random.Random, avoid: Optional[str] = None) -> Pron:
    pairs = [(k, w) for k, w in _PRONOUN_WEIGHTS.items() if k != avoid]
    return Pron(_choice_w(rng, pairs))


def _sample_possessor(rng: random.Random, head: Noun) -> tuple:
    """(possessor NP, English "of" construction?) for a possessed noun."""
    w = _world()
    if "part" in head.tags and rng.random() < 0.6:
        owner = w.noun_pool("building vehicle").pick(rng)
        return NP(owner, "the", plural=False), True
    if rng.random() < 0.4:
        return NP(w.people_pool.pick(rng)), False
    owner = w.noun_pool("person").pick(rng)
    det = _choice_w(rng, _DET_WEIGHTS["possnp"])
    plural = rng.random() < 0.2
    poss = NP(_sample_pronoun(rng)) if det == "poss" else None
    adjs = _sample_adjs(rng, owner, 0.12, 0.0)
    return NP(owner, "the" if det != "poss" else "poss", plural=plural, adjs=adjs, poss=poss), False


def _noun_np(rng: random.Random, noun: Noun, role: str, countable: bool = True) -> NP:
    det = _choice_w(rng, _DET_WEIGHTS[role])
    if det == "count" and not countable:
        det = "the"
    if noun.mass:  # no "a milk", "three milks", "every milk" or "many milk"
        indef = role == "exist"
        det = {"a": "bare", "count": "some" if indef else "the", "every": "the", "all": "the",
               "many": "some", "this": "this", "that": "that"}.get(det, det)
    if role == "pred":
        adjs = _sample_adjs(rng, noun, 0.35, 0.05)
    else:
        adjs = _sample_adjs(rng, noun)
    plural = (not noun.mass) and rng.random() < 0.28
    if det == "possnp":
        poss, of = _sample_possessor(rng, noun)
        return NP(noun, "poss", plural=plural, adjs=adjs, poss=poss, poss_of=of)
    if det == "poss":
        return NP(noun, "poss", plural=plural, adjs=adjs, poss=NP(_sample_pronoun(rng)))
    if det == "count":
        n, digits = _sample_count(rng)
        return NP(noun, "count", plural=n > 1, count=n, digits=digits, adjs=adjs)
    if det in ("all", "many") or (det == "some" and not noun.mass):
        return NP(noun, det, plural=True, adjs=adjs)
    if det == "every":
        return NP(noun, det, plural=False, adjs=adjs)
    if det in ("this", "that"):
        if plural:
            det = "these" if det == "this" else "those"
        return NP(noun, det, plural=plural, adjs=adjs)
    if det == "a":
        if plural:
            return NP(noun, "bare", plural=True, adjs=adjs)
        return NP(noun, "a", adjs=adjs)
    if det in ("bare", "some"):
        return NP(noun, det, plural=False, adjs=adjs)
    return NP(noun, "the", plural=plural, adjs=adjs)


def _sample_np(rng: random.Random, spec: str, role: str, *, pron: float = 0.0, name: float = 0.0,
               city: float = 0.0, avoid_pron: Optional[str] = None) -> NP:
    """A noun phrase whose head matches ``spec``; people may come out as pronouns or names."""
    w = _world()
    keys = set(spec.split())
    people = "person" in keys
    r = rng.random()
    if people and r < pron:
        return NP(_sample_pronoun(rng, avoid_pron))
    if people and r < pron + name:
        return NP(w.people_pool.pick(rng))
    if city and rng.random() < city:
        return NP(w.city_pool.pick(rng))
    return _noun_np(rng, w.noun_pool(spec).pick(rng), role)


def _sample_place(rng: random.Random, role: str) -> Adjunct:
    """A place for in/at/on (dative), to (dative) or from (ablative); cities are frequent."""
    w = _world()
    if rng.random() < 0.3:
        np = NP(w.city_pool.pick(rng))
        prep = "in"
    else:
        noun = w.noun_pool("place").pick(rng)
        np = _noun_np(rng, noun, "adj", countable=False)
        prep = noun.prep
    if role == "dest":
        prep = "to"
    elif role == "src":
        prep = "from"
    return Adjunct(role, np, prep)


def _sample_pp(rng: random.Random) -> Adjunct:
    noun = _world().noun_pool("surface").pick(rng)
    prep = rng.choice(tuple(_POSTPOSITIONS))
    return Adjunct("pp", _noun_np(rng, noun, "adj", countable=False), prep)


def _sample_location(rng: random.Random) -> Adjunct:
    return _sample_pp(rng) if rng.random() < 0.4 else _sample_place(rng, "loc")


def _sample_time(rng: random.Random, tense: str) -> Optional[TimeAdv]:
    if rng.random() < 0.15:
        tmpl_en, tmpl_tgt, tenses, (lo, hi) = rng.choice(_TIME_TEMPLATES)
        if tense in tenses.split():
            n = rng.randint(lo, hi)
            digits = n > 20 or rng.random() < 0.5
            return TimeAdv(tmpl_en.format(n=_num_en(n, digits)), tmpl_tgt.format(n=" ".join(_num_tgt(n, digits))),
                           frozenset(tenses.split()), False)
        return None
    for _ in range(6):
        en, tgt, tenses = _world().time_pool.pick(rng)
        if tense in tenses.split():
            return TimeAdv(en, tgt, frozenset(tenses.split()), en in _PRE_ADVERBS)
    return None


def _subject_person(np: NP) -> bool:
    return isinstance(np.head, (Pron, Name)) or (isinstance(np.head, Noun) and np.head.group == "person")


def _fits(spec: str, np: NP) -> bool:
    h = np.head
    if isinstance(h, (Pron, Name)):
        return "person" in spec.split()
    keys = set(spec.split())
    return h.en in keys or bool(h.tags & keys)


def _sample_tense(rng: random.Random, stative: bool) -> str:
    if stative:
        return _choice_w(rng, (("pres", 45), ("past", 38), ("fut", 17)))
    return _choice_w(rng, (("pres", 27), ("past", 30), ("fut", 16), ("prog", 18), ("pprog", 9)))


def _sample_act(rng: random.Random, subj: Optional[NP] = None, tense: Optional[str] = None,
                busy: float = 1.0, neg_ok: bool = True) -> Clause:
    """An action clause. ``busy`` scales how many optional parts (adjuncts, adverbs) it gets."""
    w = _world()
    for _ in range(50):
        verb = w.verb_pool.pick(rng)
        if subj is None or _fits(verb.subj_spec, subj):
            if tense is None or tense in ("pres", "past", "fut") or "stative" not in verb.flags:
                break
    else:
        raise AssertionError("no verb fits the subject")
    if subj is None:
        subj = _sample_np(rng, verb.subj_spec, "subj", pron=0.32, name=0.18)
    if tense is None:
        tense = _sample_tense(rng, "stative" in verb.flags)
    neg = neg_ok and rng.random() < 0.16
    avoid = subj.head.key if isinstance(subj.head, Pron) else None
    obj = None
    if verb.frame != "in" and not ("opt" in verb.flags and rng.random() < 0.25):
        obj = _sample_np(rng, verb.obj_spec, "obj", pron=0.15, name=0.2,
                         city=0.3 if "cityobj" in verb.flags else 0.0, avoid_pron=avoid)
    rcp, shift = None, False
    wants_rcp = False
    if obj is not None and "ask" in verb.flags:
        wants_rcp = rng.random() < 0.7
    elif obj is not None and {"rcp", "rcpfor"} & verb.flags:
        wants_rcp = rng.random() < 0.4 * busy
    if wants_rcp:
        rcp = _sample_np(rng, "person", "adj", pron=0.3, name=0.25, avoid_pron=avoid)
        shift = rcp.definite and rng.random() < 0.5  # "give the teacher a book", not "give a teacher ..."
    adjuncts = _sample_adjuncts(rng, verb, subj, busy)
    time = _sample_time(rng, tense) if rng.random() < 0.4 * busy else None
    if time and time.pre and (neg or tense != "pres"):
        time = None
    manner = None
    if rng.random() < 0.12 * busy and "stative" not in verb.flags:
        manner = rng.choice(_MANNER)
        if manner[0] == "together" and (_person(subj) != "pl" or any(a.role in ("com", "comt") for a in adjuncts)):
            manner = None
        elif manner[0] == "alone" and _person(subj) == "pl":
            manner = None
    return Clause("act", subj, tense, neg, verb, obj, rcp, shift, adjuncts, time=time,
                  time_front=rng.random() < 0.3, manner=manner, contract=rng.random() < 0.35)


def _sample_adjuncts(rng: random.Random, verb: Verb, subj: NP, busy: float) -> tuple:
    flags = verb.flags
    options = []
    if "mot" in flags:
        options += [("dest", 40), ("src", 20)]
        if _subject_person(subj):
            options.append(("veh", 14))
    else:
        options.append(("loc", 35))
        if "pp" in flags:
            options.append(("pp", 25))
        if "src" in flags:
            options.append(("src", 22))
    if verb.ins_spec:
        options.append(("ins", 30))
    if _subject_person(subj) and verb.frame not in ("com",):
        options.append(("com", 20))
    r = rng.random() / busy
    n = 2 if r < 0.22 else 1 if r < 0.62 else 0
    if verb.frame == "in":
        n = max(n, 1)  # "A doctor prayed." is too bare to teach anything
    roles = []
    if "needloc" in flags or "arrive" in flags:
        roles.append("loc" if "needloc" in flags else "arrive")
    while len(roles) < n and options:
        role = _choice_w(rng, options)
        options = [o for o in options if o[0] != role]
        roles.append(role)
    out = []
    for role in roles:
        if role == "loc":
            out.append(_sample_location(rng) if "pp" in flags else _sample_place(rng, "loc"))
        elif role == "arrive":
            a = _sample_place(rng, "loc")
            out.append(Adjunct("dest", a.np, a.prep))
        elif role in ("dest", "src"):
            out.append(_sample_place(rng, role))
        elif role == "pp":
            out.append(_sample_pp(rng))
        elif role == "veh":
            out.append(Adjunct("veh", NP(_world().noun_pool("vehicle").pick(rng), "bare"), "by"))
        elif role == "ins":
            noun = _world().noun_pool(verb.ins_spec).pick(rng)
            out.append(Adjunct("ins", _noun_np(rng, noun, "adj"), "with"))
        else:  # "with X" or "together with X" (+ хамт)
            np = _sample_np(rng, "person", "adj", pron=0.2, name=0.3)
            together = rng.random() < 0.3
            out.append(Adjunct("comt" if together else "com", np, "together with" if together else "with"))
    return tuple(out)


def _sample_copula(rng: random.Random, kind: str, neg_ok: bool = True) -> Clause:
    w = _world()
    tense = _choice_w(rng, (("pres", 45), ("past", 38), ("fut", 17)))
    neg = neg_ok and rng.random() < 0.18
    time = _sample_time(rng, tense) if rng.random() < 0.3 else None
    if time and time.pre:
        time = None
    common = dict(tense=tense, neg=neg, time=time, time_front=rng.random() < 0.3, contract=rng.random() < 0.35)
    if kind == "cop_adj":
        subj = _sample_np(rng, "person animal object food place plant", "subj", pron=0.25, name=0.2)
        cls = "anim" if _subject_person(subj) else _ADJ_CLASS_OF_GROUP[subj.head.group]
        pred = w.adj_pool(cls).pick(rng)
        return Clause("cop_adj", subj, pred=pred, **common)
    if kind == "cop_noun":
        subj = _sample_np(rng, "person", "subj", pron=0.4, name=0.45)
        pred_noun = w.noun_pool("person").pick(rng)
        pred = _noun_np(rng, pred_noun, "pred")
        plural = _person(subj) == "pl"
        pred = replace(pred, det="bare" if plural else "a", plural=plural)
        return Clause("cop_noun", subj, pred=pred, **common)
    if kind == "cop_loc":
        subj = _sample_np(rng, "person animal object", "subj", pron=0.25, name=0.2)
        return Clause("cop_loc", subj, loc=_sample_location(rng), **common)
    noun = w.noun_pool("person animal object food plant").pick(rng)
    subj = _noun_np(rng, noun, "exist")
    if neg:
        subj = replace(subj, det="no", count=0, digits=False)
    return Clause("exist", subj, loc=_sample_location(rng), **common)


def _sample_clause(rng: random.Random, busy: float = 1.0, neg_ok: bool = True) -> Clause:
    kind = _choice_w(rng, (("act", 72), ("cop_adj", 9), ("cop_noun", 5), ("cop_loc", 6), ("exist", 8)))
    if kind == "act":
        return _sample_act(rng, busy=busy, neg_ok=neg_ok)
    return _sample_copula(rng, kind, neg_ok=neg_ok)


def sample_sentence(rng: random.Random) -> Sentence:
    """Sample one meaning: mostly a single clause, sometimes a question or two joined clauses."""
    if rng.random() < 0.22:
        conj = _choice_w(rng, (("and_same", 40), ("and", 22), ("but", 20), ("because", 18)))
        if conj == "and_same":
            first = _sample_act(rng, busy=0.8)
            first = replace(first, neg=False, time_front=True)
            second = _sample_act(rng, subj=first.subj, tense=first.tense, busy=0.7)
            second = replace(second, time=None)
            return Sentence((first, second), conj)
        first = _sample_clause(rng, 0.8)
        second = replace(_sample_clause(rng, 0.8), time_front=False)  # not "because in spring, she ..."
        return Sentence((first, second), conj)
    # Questions are never negated: "Didn't he ...?" would need its own answer-polarity grammar.
    if rng.random() < 0.14:
        clause = _sample_clause(rng, neg_ok=False)
        return Sentence((replace(clause, time_front=False),), question=True)
    return Sentence((_sample_clause(rng),))


def generate_pairs(n: int, seed: int) -> list:
    """``n`` pairs, deterministic in ``seed``; a shorter list is a prefix of a longer one."""
    rng = random.Random(seed)
    return [render(sample_sentence(rng)) for _ in range(n)]


def _stream(seed: int) -> Iterator[Pair]:
    rng = random.Random(seed)
    while True:
        yield render(sample_sentence(rng))


def build_splits(seed: int, sizes: dict) -> dict:
    """Splits of the requested sizes, disjoint on the source side.

    Each new distinct source is dealt to a split at random in proportion to the room left, so every
    split is a random sample of the same distribution; dealing splits in order would push the common
    short sentences into whichever split is filled first.
    """
    for name, size in sizes.items():
        if size < 0:
            raise ValueError(f"split {name!r}: negative size {size}")
    out = {name: [] for name in sizes}
    room = {name: size for name, size in sizes.items() if size > 0}
    deal = random.Random(f"tinyworld-deal-{seed}")
    seen = set()
    total = sum(room.values())
    budget = 50 * total + 1000
    stream = _stream(seed)
    while room:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"could not find {total} distinct sources")
        pair = next(stream)
        if pair.src in seen:
            continue
        seen.add(pair.src)
        x = deal.random() * sum(room.values())
        for name in list(room):
            x -= room[name]
            if x < 0 or name == list(room)[-1]:
                out[name].append(pair)
                room[name] -= 1
                if room[name] == 0:
                    del room[name]
                break
    return out


def _content_forms(items) -> set:
    """Lower-cased English surface forms of nouns, adjectives or verbs (particles left out)."""
    forms = set()
    for item in items:
        if isinstance(item, Noun):
            forms |= {item.en, item.en_pl}
        elif isinstance(item, Adj):
            forms.add(item.en)
        else:
            for words in (item.en_base(), item.en_pastform(), item.en_third(), item.en_ing()):
                forms.add(words[0])
    return {f.lower() for f in forms}


@functools.lru_cache(maxsize=4)
def rare_forms(common_fraction: float) -> frozenset:
    """English forms of the content words outside the most frequent ``common_fraction`` of each
    word class (nouns, adjectives, verbs, by their sampling weight), minus forms a common word shares."""
    w = _world()
    common, rare = set(), set()
    for items in (w.nouns, w.adjs, w.verbs):
        ranked = sorted(items, key=lambda x: -x.weight)
        k = max(1, round(common_fraction * len(ranked)))
        common |= _content_forms(ranked[:k])
        rare |= _content_forms(ranked[k:])
    return frozenset(rare - common)


_SRC_WORD = re.compile(r"[a-z']+")


def is_narrow(pair: Pair, common_fraction: float) -> bool:
    """True when the source uses no content word outside the common part of the lexicon."""
    rare = rare_forms(common_fraction)
    return not any(word in rare for word in _SRC_WORD.findall(pair.src.lower()))


def narrow_pairs(n: int, seed: int, common_fraction: float, exclude: set) -> list:
    """``n`` distinct pairs whose sources use only common content words (``is_narrow``), none of
    whose sources is in ``exclude``: the "pretraining" corpus of the tiny world's base translators,
    the same language as the task but a narrower slice of it."""
    out, seen = [], set(exclude)
    budget = 400 * n + 1000
    for pair in _stream(seed):
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"could not find {n} narrow sources (common_fraction {common_fraction})")
        if pair.src in seen or not is_narrow(pair, common_fraction):
            continue
        seen.add(pair.src)
        out.append(pair)
        if len(out) == n:
            return out
    return out


# =============================================================================================
# Analysis of target words and corruptions for quality-estimation data
# =============================================================================================


@functools.lru_cache(maxsize=1)
def _index() -> dict:
    """Every inflected single-word form the grammar can produce -> its analyses.

    Corruptions work on strings (a caller may load pairs from disk), so they re-analyse each target
    word against this table and re-inflect it with one feature changed.
    """
    w = _world()
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
    for key in _PRONOUNS:
        for case in CASES:
            form = _pron_tgt(key, case)
            if not any(a[0] == "pron" and a[2] == case for a in idx[form]):
                idx[form].append(("pron", key, case))
    for v in w.verbs:
        for key, form in verb_forms(v.tgt).items():
            idx[form].append(("verb", v, key))
    for a in w.adjs:
        idx[a.tgt].append(("adj", a))
        if a.tgt_anim != a.tgt:
            idx[a.tgt_anim].append(("adj", a))
    for k, form in _NUM_TGT.items():
        idx[form].append(("num", k))
    for word in _AUX_WORDS:
        idx[word].append(("aux", word))
    for word in _PARTICLES:
        idx[word].append(("q", word))
    for word in _FUNCTION_WORDS:
        idx[word].append(("func", word))
    for en, tgt in _MANNER:
        idx[tgt].append(("adv", en))
    for en, tgt, _ in _TIME_ADVERBS:
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
            return _PRONOUNS[a[1]][0 if a[2] == "nom" else 1]
        if a[0] == "verb":
            v = a[1]
            if a[2].startswith("past"):
                return v.en_past
            if a[2] == "conv":
                return " ".join(v.en_ing())
            return v.en
        if a[0] == "num":
            return _NUM_EN[a[1]]
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
        wrong = attach_case(base, case, _FLIP[harmony(base)])
        if wrong != tok:
            return wrong
    new_case = rng.choice([c for c in CASES if c != case])
    if a[0] == "noun":
        return " ".join(a[1].forms(a[2], new_case))
    if a[0] == "name":
        return attach_case(a[1].tgt, new_case)
    if a[0] == "nar":
        return attach_case("нар", new_case)
    return _pron_tgt(a[1], new_case)


def _fix_particles(toks: list) -> list:
    out = list(toks)
    for i, t in enumerate(out):
        if t in _PARTICLES and i > 0 and out[i - 1] not in _PUNCT:
            out[i] = question_particle(out[i - 1])
    return out


_PREMODIFIERS = frozenset({"энэ", "тэр", "эдгээр", "тэдгээр", "бүх", "олон", "хэдэн", "жаахан"})
_POSTMODIFIERS = frozenset(set(_POSTPOSITIONS.values()) | {"бүр", "хамт"})


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
        question = end < len(toks) and toks[end] in _PARTICLES
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
        new = _verb_words(verb.tgt, rng.choice(choices), neg, question)
        return _fix_particles(toks[:i] + new + toks[end:])
    # A copular sentence: swap the auxiliary, or add one where the present has none.
    start, end = _predicate_span(toks)
    span = [t for t in toks[start:end] if t not in _PARTICLES]
    aux = [t for t in span if t in _AUX_WORDS]
    tail = [t for t in toks[start:end] if t in _PARTICLES]
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
        new = rng.choice([k for k in _NUM_TGT if k != current])
        return toks[:i] + [_NUM_TGT[new]] + toks[i + 1:]
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
        return toks[:i] + [_pron_tgt(other, a[2])] + toks[i + 1:]
    if not words:
        return None
    i = words[0]
    return toks[:i] + [_NUM_TGT[rng.randint(2, 10)]] + toks[i:]


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
    words = text.split()
    if not words:
        return text
    if kind == "over_long":
        extra = filler.split() or words
        return " ".join(words + extra[: rng.randint(2, 6)])
    if kind == "repeated_ngram":
        n = min(len(words), rng.randint(1, 3))
        start = rng.randrange(len(words) - n + 1)
        gram = words[start:start + n]
        return " ".join(words[:start + n] + gram * rng.randint(2, 4) + words[start + n:])
    if kind == "run_on_copy":
        return f"{text} {text}"
    return romanize(text)


if __name__ == "__main__":  # a quick look: python -m qeebm.tinyworld.language [N] [SEED]
    import sys

    _n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    _seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    for _p in generate_pairs(_n, _seed):
        print(_p.src)
        print("    " + _p.tgt)
