"""The meaning representation (``NP``, ``Adjunct``, ``Clause``, ``Sentence``) and its rendering into
English and into the target, with the pair's language codes and the ``Pair`` that ``render``
returns. Both sides are rendered independently from one meaning, so they agree by construction;
what is said is decided by sampling.py, and this module only decides how each language says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from qeebm.tinyworld.language.morphology import (
    a_or_an,
    attach_case,
    copula_words,
    question_particle,
    verb_forms,
    verb_words,
)
from qeebm.tinyworld.language.vocabulary import (
    POSTPOSITIONS,
    PRONOUNS,
    Name,
    Noun,
    Pron,
    TimeAdv,
    Verb,
    num_en,
    num_tgt,
    pron_tgt,
)

SRC_LANG = "eng_Latn"
TGT_LANG = "khk_Cyrl"


@dataclass(frozen=True)
class Pair:
    """One parallel sentence: English source, Tiny Mongolian target."""

    src: str
    tgt: str


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
        subj, obj, poss, _ = PRONOUNS[h.key]
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
        words = [a_or_an(core[0])] + core
    elif np.det == "bare":
        words = core
    elif np.det == "count":
        words = [num_en(np.count, np.digits)] + core
    elif np.det == "all":
        words = ["all", "the"] + core
    else:
        words = [np.det] + core
    if role == "poss":
        last = words[-1]
        words[-1] = last + ("'" if np.plural and last.endswith("s") else "'s")
    return words


def person_of(np: NP) -> str:
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
    person = person_of(cl.subj)
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
_DET_TGT = {"this": "энэ", "that": "тэр", "these": "эдгээр", "those": "тэдгээр", "all": "бүх", "many": "олон"}
_CONJ_TGT = {"and": "ба", "but": "гэвч"}


def _tgt_np(np: NP, case: str, mark_plural: bool = True) -> list:
    """Target words: possessor-GEN, determiner/numeral, adjectives, head with the case suffix."""
    h = np.head
    if isinstance(h, Pron):
        return [pron_tgt(h.key, case)]
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
        words += num_tgt(np.count, np.digits)
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
        return _tgt_np(a.np, "gen") + [POSTPOSITIONS[a.prep]]
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
        words += copula_words(cl.kind, cl.tense, cl.neg, question)
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
                words += verb_words(cl.verb.tgt, cl.tense, cl.neg, question)
        elif cl.kind == "cop_adj":
            words.append(cl.pred.tgt_for(cl.subj.head))
            words += copula_words(cl.kind, cl.tense, cl.neg, question)
        elif cl.kind == "cop_noun":
            words += ["бол"] + _tgt_np(cl.pred, "nom")
            words += copula_words(cl.kind, cl.tense, cl.neg, question)
        else:
            words += _tgt_adjunct(cl.loc) + copula_words(cl.kind, cl.tense, cl.neg, question)
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
