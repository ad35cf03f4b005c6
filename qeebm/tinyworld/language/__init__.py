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

# Layers, lowest first: morphology <- vocabulary <- grammar <- sampling, and corruption on the first
# three. The vocabulary module is not named lexicon.py: the package's lexicon must be the function below.
from qeebm.tinyworld.language.corruption import CORRUPTIONS, DEGENERATIONS, analyze, corrupt, degenerate
from qeebm.tinyworld.language.grammar import NP, SRC_LANG, TGT_LANG, Clause, Pair, Sentence, render
from qeebm.tinyworld.language.morphology import CASES, attach_case, harmony, pluralize, question_particle, verb_forms
from qeebm.tinyworld.language.sampling import build_splits, generate_pairs, is_narrow, narrow_pairs, sample_sentence
from qeebm.tinyworld.language.vocabulary import Noun, lexicon, transliterate

__all__ = [
    "CASES",
    "CORRUPTIONS",
    "Clause",
    "DEGENERATIONS",
    "NP",
    "Noun",
    "Pair",
    "SRC_LANG",
    "Sentence",
    "TGT_LANG",
    "analyze",
    "attach_case",
    "build_splits",
    "corrupt",
    "degenerate",
    "generate_pairs",
    "harmony",
    "is_narrow",
    "lexicon",
    "narrow_pairs",
    "pluralize",
    "question_particle",
    "render",
    "sample_sentence",
    "transliterate",
    "verb_forms",
]
