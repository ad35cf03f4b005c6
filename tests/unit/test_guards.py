import sys
import types

import pytest

from qeebm.errors import QeebmError
from qeebm.guards import GuardConfig, char_ngram_f1, check, hit_rates, language_id_backend

SRC = "The cat is sitting on the mat in the kitchen."
GOOD = "Кошка сидит на коврике на кухне."
TGT = "rus_Cyrl"


def words_plus_specials(texts, side):
    # Stands in for Translator.num_tokens: words, plus the language code and </s>.
    return [len(t.split()) + 2 for t in texts]


def run(hyp, src=SRC, **cfg):
    cfg.setdefault("length_unit", "chars")
    return check([src] * len(hyp), hyp, GuardConfig(**cfg), TGT)


def test_good_translation_passes_every_guard():
    res = run([GOOD])
    assert res.penalty == [0.0]
    assert set(res.hits) == {"empty", "copy", "length_ratio", "script", "repetition"}
    assert not any(flags[0] for flags in res.hits.values())


@pytest.mark.parametrize(
    "guard,hyp",
    [
        ("empty", "   "),
        ("copy", SRC),
        ("copy", "the cat is sitting on the mat in the kitchen"),  # case and punctuation differ
        ("length_ratio", GOOD * 3),
        ("script", "Кошка is sitting on the mat in the kitchen."),  # Latin letters in a Cyrillic target
        ("repetition", "ба ба ба ба ба ба"),
    ],
)
def test_each_guard_fires_on_its_crafted_output(guard, hyp):
    res = run([hyp, GOOD])
    assert res.hits[guard] == [True, False]
    assert res.penalty == [1.0, 0.0]


def test_penalties_take_the_largest_hit_once():
    # The copy also has the wrong script: pays max(0.3, 0.7), not the sum.
    res = run([SRC], copy_penalty=0.3, script_penalty=0.7)
    assert res.hits["copy"] == [True] and res.hits["script"] == [True]
    assert res.penalty == [0.7]


def test_disabled_guards_do_not_run():
    res = run(["   "], empty=False, length_ratio=False)
    assert "empty" not in res.hits and "length_ratio" not in res.hits
    assert res.penalty == [0.0]


def test_copy_guard_spares_letterless_sources_and_real_translations():
    res = check(["2019", SRC], ["2019", GOOD], GuardConfig(length_unit="chars"), TGT)
    assert res.hits["copy"] == [False, False]
    assert char_ngram_f1("Die Katze sitzt auf der Matte.", "The cat is sitting on the mat.") < 0.3


def test_length_ratio_in_tokens_uses_the_published_pair_range():
    cfg = GuardConfig()  # length_unit="tokens"
    assert cfg.ranges()[("eng_Latn", "deu_Latn")] == (1.05, 1.36)
    assert cfg.ranges()[("eng_Latn", "zho_Hans")] == (0.86, 1.12)
    src = "one two three four five six seven eight"  # 8 words + 2 = 10 tokens
    # 10 tokens each: ratio 1.0, below en-de's 1.05; 11 words + 2 = 13: ratio 1.3, inside
    hyp = ["eins zwei drei vier fünf sechs sieben acht", "eins zwei drei vier fünf sechs sieben acht neun zehn elf"]
    res = check([src, src], hyp, cfg, "deu_Latn", count_tokens=words_plus_specials)
    assert res.hits["length_ratio"] == [True, False]
    # mBART codes name the same pair.
    res = check([src, src], hyp, cfg, "de_DE", src_lang="en_XX", count_tokens=words_plus_specials)
    assert res.hits["length_ratio"] == [True, False]
    with pytest.raises(ValueError, match="count_tokens"):
        check([src], hyp[:1], cfg, "deu_Latn")
    # In characters the token table does not apply: the generic range does.
    assert GuardConfig(length_unit="chars").ranges() == {}


def test_repetition_guard_allows_repetition_the_source_has():
    src = "ha ha ha ha ha ha, he said"
    cfg = GuardConfig(length_unit="chars", repetition_max_share=1.0)
    res = check([src], ["ха ха ха ха ха ха, сказал он"], cfg, TGT)
    assert res.hits["repetition"] == [False]


def test_script_guard_for_other_scripts():
    cfg = GuardConfig(length_unit="chars")
    assert check([SRC], ["猫坐在厨房的垫子上。"], cfg, "zho_Hans").hits["script"] == [False]
    assert check([SRC], ["猫坐在厨房的垫子上。"], cfg, "kat_Geor").hits["script"] == [True]
    assert check([SRC], ["კატა ზის ხალიჩაზე."], cfg, "kat_Geor").hits["script"] == [False]
    # No letters at all is not a wrong script.
    assert check(["2019"], ["2019"], cfg, "kat_Geor").hits["script"] == [False]
    with pytest.raises(QeebmError, match="target_script"):
        GuardConfig(target_script="Klingon")


def test_hit_rates_are_logged_per_guard():
    res = run([GOOD, "", SRC, "ба ба ба ба ба ба"])
    rates = hit_rates(res)
    assert rates["guard/empty"] == 0.25
    assert rates["guard/copy"] == 0.25
    assert rates["guard/repetition"] == 0.25
    assert rates["guard/any"] == 0.75
    # Contributions to a global step of 8 samples.
    assert hit_rates(res, normaliser=8)["guard/any"] == 0.375


def test_language_id_refuses_without_an_installed_backend(monkeypatch):
    monkeypatch.setattr("qeebm.guards.language_id_backend", lambda: None)
    with pytest.raises(QeebmError, match="no offline language-ID package"):
        GuardConfig(language_id=True)


def test_language_id_with_a_backend(monkeypatch):
    # A stand-in for langid (not installed here): says "ru" for Cyrillic, "en" otherwise.
    fake = types.ModuleType("langid")
    fake.classify = lambda text: ("ru" if any("а" <= ch <= "я" for ch in text.lower()) else "en", 1.0)
    monkeypatch.setitem(sys.modules, "langid", fake)
    monkeypatch.setattr("qeebm.guards.language_id_backend", lambda: "langid")
    res = check([SRC, SRC], [GOOD, "A cat sits on a mat."], GuardConfig(language_id=True, length_unit="chars"), TGT)
    assert res.hits["language_id"] == [False, True]


def test_language_id_backend_reports_what_is_installed():
    assert language_id_backend() in (None, "langid", "py3langid", "lingua")
