"""Drawing meanings and turning them into corpora: ``sample_sentence`` picks a meaning from the
lexicon with fixed weights, ``generate_pairs`` and ``build_splits`` render seeded streams of them
(the splits disjoint on the source side), and ``narrow_pairs`` keeps only the sentences of common
words that the base translators are pretrained on. Each call owns one ``random.Random`` and draws
from it in a fixed order, so a seed gives byte-identical data on every machine and under any
string hashing, which the hashes in the tiny world's build manifests rely on.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import replace
from typing import Iterator, Optional

from qeebm.tinyworld.language.grammar import NP, Adjunct, Clause, Pair, Sentence, person_of, render
from qeebm.tinyworld.language.vocabulary import (
    ADJ_CLASS_OF_GROUP,
    MANNER,
    POSTPOSITIONS,
    PRE_ADVERBS,
    TIME_TEMPLATES,
    Adj,
    Name,
    Noun,
    Pron,
    TimeAdv,
    Verb,
    lexicon,
    num_en,
    num_tgt,
)

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
_PRONOUN_WEIGHTS = {"1sg": 22, "2sg": 14, "3m": 18, "3f": 18, "1pl": 12, "3pl": 16}


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
    pool = lexicon().adj_pool(ADJ_CLASS_OF_GROUP[noun.group])
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
    w = lexicon()
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
    w = lexicon()
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
    w = lexicon()
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
    noun = lexicon().noun_pool("surface").pick(rng)
    prep = rng.choice(tuple(POSTPOSITIONS))
    return Adjunct("pp", _noun_np(rng, noun, "adj", countable=False), prep)


def _sample_location(rng: random.Random) -> Adjunct:
    return _sample_pp(rng) if rng.random() < 0.4 else _sample_place(rng, "loc")


def _sample_time(rng: random.Random, tense: str) -> Optional[TimeAdv]:
    if rng.random() < 0.15:
        tmpl_en, tmpl_tgt, tenses, (lo, hi) = rng.choice(TIME_TEMPLATES)
        if tense in tenses.split():
            n = rng.randint(lo, hi)
            digits = n > 20 or rng.random() < 0.5
            return TimeAdv(tmpl_en.format(n=num_en(n, digits)), tmpl_tgt.format(n=" ".join(num_tgt(n, digits))),
                           frozenset(tenses.split()), False)
        return None
    for _ in range(6):
        en, tgt, tenses = lexicon().time_pool.pick(rng)
        if tense in tenses.split():
            return TimeAdv(en, tgt, frozenset(tenses.split()), en in PRE_ADVERBS)
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
    w = lexicon()
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
        manner = rng.choice(MANNER)
        if manner[0] == "together" and (person_of(subj) != "pl" or any(a.role in ("com", "comt") for a in adjuncts)):
            manner = None
        elif manner[0] == "alone" and person_of(subj) == "pl":
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
            out.append(Adjunct("veh", NP(lexicon().noun_pool("vehicle").pick(rng), "bare"), "by"))
        elif role == "ins":
            noun = lexicon().noun_pool(verb.ins_spec).pick(rng)
            out.append(Adjunct("ins", _noun_np(rng, noun, "adj"), "with"))
        else:  # "with X" or "together with X" (+ хамт)
            np = _sample_np(rng, "person", "adj", pron=0.2, name=0.3)
            together = rng.random() < 0.3
            out.append(Adjunct("comt" if together else "com", np, "together with" if together else "with"))
    return tuple(out)


def _sample_copula(rng: random.Random, kind: str, neg_ok: bool = True) -> Clause:
    w = lexicon()
    tense = _choice_w(rng, (("pres", 45), ("past", 38), ("fut", 17)))
    neg = neg_ok and rng.random() < 0.18
    time = _sample_time(rng, tense) if rng.random() < 0.3 else None
    if time and time.pre:
        time = None
    common = dict(tense=tense, neg=neg, time=time, time_front=rng.random() < 0.3, contract=rng.random() < 0.35)
    if kind == "cop_adj":
        subj = _sample_np(rng, "person animal object food place plant", "subj", pron=0.25, name=0.2)
        cls = "anim" if _subject_person(subj) else ADJ_CLASS_OF_GROUP[subj.head.group]
        pred = w.adj_pool(cls).pick(rng)
        return Clause("cop_adj", subj, pred=pred, **common)
    if kind == "cop_noun":
        subj = _sample_np(rng, "person", "subj", pron=0.4, name=0.45)
        pred_noun = w.noun_pool("person").pick(rng)
        pred = _noun_np(rng, pred_noun, "pred")
        plural = person_of(subj) == "pl"
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
    w = lexicon()
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
