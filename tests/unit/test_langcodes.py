import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from qeebm.errors import QeebmError
from qeebm.utils.langcodes import MBART50_TO_NLLB, NLLB_CODES, NLLB_TO_MBART50, script_of, to_model_code

MBART50 = (
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV "
    "my_MM ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID "
    "ka_GE km_KH mk_MK ml_IN mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA "
    "ur_PK xh_ZA gl_ES sl_SI"
).split()


def test_table_covers_mbart50_and_is_a_bijection():
    assert sorted(MBART50_TO_NLLB) == sorted(MBART50)
    assert len(set(MBART50_TO_NLLB.values())) == 52
    for mbart, nllb in MBART50_TO_NLLB.items():
        assert nllb in NLLB_CODES, mbart
        assert NLLB_TO_MBART50[nllb] == mbart
        assert to_model_code(mbart, "nllb") == nllb
        assert to_model_code(nllb, "mbart") == mbart


def test_nllb_codes_match_the_tokenizer():
    assert len(NLLB_CODES) == 202
    try:
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
    except ImportError:
        pytest.skip("transformers has no NLLB tokenizer module")
    assert NLLB_CODES == frozenset(FAIRSEQ_LANGUAGE_CODES)


def test_mbart_codes_match_the_tokenizer():
    try:
        from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES
    except ImportError:
        pytest.skip("transformers has no mBART-50 tokenizer module")
    assert set(MBART50_TO_NLLB) == set(FAIRSEQ_LANGUAGE_CODES)


@pytest.mark.parametrize(
    "mbart,nllb",
    [
        ("mn_MN", "khk_Cyrl"),
        ("en_XX", "eng_Latn"),
        ("zh_CN", "zho_Hans"),
        ("az_AZ", "azj_Latn"),
        ("ar_AR", "arb_Arab"),
        ("fa_IR", "pes_Arab"),
        ("lv_LV", "lvs_Latn"),
        ("ps_AF", "pbt_Arab"),
        ("sw_KE", "swh_Latn"),
        ("ne_NP", "npi_Deva"),
        ("tl_XX", "tgl_Latn"),
        ("et_EE", "est_Latn"),
    ],
)
def test_hand_checked_pairs(mbart, nllb):
    assert MBART50_TO_NLLB[mbart] == nllb
    assert NLLB_TO_MBART50[nllb] == mbart


def test_to_model_code_by_family():
    assert to_model_code("eng_Latn", "nllb") == "eng_Latn"
    assert to_model_code("khk_Cyrl", "mbart") == "mn_MN"
    assert to_model_code("mn_MN", "mbart") == "mn_MN"
    assert to_model_code("mn_MN", "nllb") == "khk_Cyrl"
    # An NLLB-only language is fine for NLLB.
    assert to_model_code("zsm_Latn", "nllb") == "zsm_Latn"


@pytest.mark.parametrize(
    "code,suggestion",
    [("eng_latn", "eng_Latn"), ("khk_Cyr", "khk_Cyrl"), ("mon_Cyrl", "khk_Cyrl"), ("eng", "eng_Latn")],
)
def test_unknown_code_names_it_and_the_closest(code, suggestion):
    with pytest.raises(QeebmError) as err:
        to_model_code(code, "nllb")
    msg = str(err.value)
    assert f"'{code}'" in msg and f"'{suggestion}'" in msg
    assert "\n" not in msg


def test_nllb_language_missing_from_mbart():
    with pytest.raises(QeebmError, match="mBART-50 has no such language") as err:
        to_model_code("zsm_Latn", "mbart")
    assert "zsm_Latn" in str(err.value)


def test_empty_code_and_bad_family():
    with pytest.raises(QeebmError, match="empty"):
        to_model_code("", "nllb")
    with pytest.raises(ValueError):
        to_model_code("eng_Latn", "marian")


def test_script_of():
    assert script_of("khk_Cyrl") == "Cyrl"
    assert script_of("mn_MN") == "Cyrl"
    assert script_of("zh_CN") == "Hans"
    assert script_of("eng_Latn") == "Latn"
    with pytest.raises(QeebmError, match="xx_Yy"):
        script_of("xx_Yy")
