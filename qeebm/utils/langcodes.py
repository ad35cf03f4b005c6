"""Language codes: NLLB-200 (``eng_Latn``) is the project's spelling; mBART-50 (``en_XX``) is what
mBART checkpoints expect.

Configs always use NLLB codes (mBART codes are accepted too), and ``to_model_code`` turns them into
whatever the loaded model family needs, so one recipe runs on either family. A mistyped code is
caught here, with a suggestion, before any model is loaded.
"""

from __future__ import annotations

import difflib

from qeebm.errors import QeebmError

# NLLB uses ISO 639-3 plus ISO 15924 script. Where mBART-50 names a macrolanguage, NLLB names the
# individual language it was trained on: Mongolian is Khalkha (khk), Azerbaijani is North
# Azerbaijani (azj), Persian is Iranian Persian (pes), Latvian is Standard Latvian (lvs), Pashto is
# Southern Pashto (pbt), Swahili is Kiswahili (swh), Nepali is npi, Arabic is Modern Standard (arb).
MBART50_TO_NLLB: dict[str, str] = {
    "ar_AR": "arb_Arab",
    "cs_CZ": "ces_Latn",
    "de_DE": "deu_Latn",
    "en_XX": "eng_Latn",
    "es_XX": "spa_Latn",
    "et_EE": "est_Latn",
    "fi_FI": "fin_Latn",
    "fr_XX": "fra_Latn",
    "gu_IN": "guj_Gujr",
    "hi_IN": "hin_Deva",
    "it_IT": "ita_Latn",
    "ja_XX": "jpn_Jpan",
    "kk_KZ": "kaz_Cyrl",
    "ko_KR": "kor_Hang",
    "lt_LT": "lit_Latn",
    "lv_LV": "lvs_Latn",
    "my_MM": "mya_Mymr",
    "ne_NP": "npi_Deva",
    "nl_XX": "nld_Latn",
    "ro_RO": "ron_Latn",
    "ru_RU": "rus_Cyrl",
    "si_LK": "sin_Sinh",
    "tr_TR": "tur_Latn",
    "vi_VN": "vie_Latn",
    "zh_CN": "zho_Hans",
    "af_ZA": "afr_Latn",
    "az_AZ": "azj_Latn",
    "bn_IN": "ben_Beng",
    "fa_IR": "pes_Arab",
    "he_IL": "heb_Hebr",
    "hr_HR": "hrv_Latn",
    "id_ID": "ind_Latn",
    "ka_GE": "kat_Geor",
    "km_KH": "khm_Khmr",
    "mk_MK": "mkd_Cyrl",
    "ml_IN": "mal_Mlym",
    "mn_MN": "khk_Cyrl",
    "mr_IN": "mar_Deva",
    "pl_PL": "pol_Latn",
    "ps_AF": "pbt_Arab",
    "pt_XX": "por_Latn",
    "sv_SE": "swe_Latn",
    "sw_KE": "swh_Latn",
    "ta_IN": "tam_Taml",
    "te_IN": "tel_Telu",
    "th_TH": "tha_Thai",
    "tl_XX": "tgl_Latn",
    "uk_UA": "ukr_Cyrl",
    "ur_PK": "urd_Arab",
    "xh_ZA": "xho_Latn",
    "gl_ES": "glg_Latn",
    "sl_SI": "slv_Latn",
}

NLLB_TO_MBART50: dict[str, str] = {nllb: mbart for mbart, nllb in MBART50_TO_NLLB.items()}

# The 202 languages of NLLB-200, as its tokenizer spells them.
NLLB_CODES: frozenset[str] = frozenset(
    """
    ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn als_Latn amh_Ethi
    apc_Arab arb_Arab ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab
    azj_Latn bak_Cyrl bam_Latn ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn
    bod_Tibt bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn cjk_Latn ckb_Arab crh_Latn
    cym_Latn dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn est_Latn
    eus_Latn ewe_Latn fao_Latn fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gaz_Latn
    gla_Latn gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva
    hrv_Latn hun_Latn hye_Armn ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan
    kab_Latn kac_Latn kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor kaz_Cyrl kbp_Latn kea_Latn
    khk_Cyrl khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kmr_Latn knc_Arab knc_Latn kon_Latn
    kor_Hang lao_Laoo lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn lua_Latn
    lug_Latn luo_Latn lus_Latn lvs_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl
    mlt_Latn mni_Beng mos_Latn mri_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva nso_Latn
    nus_Latn nya_Latn oci_Latn ory_Orya pag_Latn pan_Guru pap_Latn pbt_Arab pes_Arab plt_Latn
    pol_Latn por_Latn prs_Arab quy_Latn ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng
    scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn
    spa_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml taq_Latn
    taq_Tfng tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi tpi_Latn tsn_Latn tso_Latn
    tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab uzn_Latn
    vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans zho_Hant
    zsm_Latn zul_Latn
    """.split()
)

FAMILIES = ("nllb", "mbart")


# ISO 639 macrolanguage codes people tend to type, and the individual language NLLB uses instead.
_MACRO = {"mon": "khk", "ara": "arb", "fas": "pes", "per": "pes", "lav": "lvs", "pus": "pbt",
          "swa": "swh", "nep": "npi", "aze": "azj", "msa": "zsm", "may": "zsm", "chi": "zho"}


def _closest(code: str) -> str:
    """The valid code nearest to ``code``. Case is ignored so ``eng_latn`` finds ``eng_Latn``, and
    the language part is tried first so ``eng``, ``mn`` or ``mon_Cyrl`` find their full code;
    there is always an answer."""
    options = sorted(NLLB_CODES | set(MBART50_TO_NLLB))
    by_lower = {o.lower(): o for o in options}
    low = code.strip().lower()
    lang = low.split("_")[0]
    lang = _MACRO.get(lang, lang)
    same_lang = [o for o in by_lower if o.split("_")[0] == lang]
    pool = same_lang or list(by_lower)
    match = difflib.get_close_matches(low, pool, n=1, cutoff=0.0)
    return by_lower[match[0]] if match else by_lower[pool[0]]


def to_model_code(code: str, family: str) -> str:
    """The code a model of ``family`` ("nllb" or "mbart") uses for ``code`` (NLLB or mBART-50)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")
    if not code.strip():
        raise QeebmError("language code is empty; use an NLLB-200 code such as eng_Latn or khk_Cyrl")
    if code in MBART50_TO_NLLB:
        return MBART50_TO_NLLB[code] if family == "nllb" else code
    if code in NLLB_CODES:
        if family == "nllb":
            return code
        if code in NLLB_TO_MBART50:
            return NLLB_TO_MBART50[code]
        raise QeebmError(
            f"language '{code}' is an NLLB-200 language but mBART-50 has no such language; "
            "use an NLLB model or one of the 52 mBART-50 languages"
        )
    raise QeebmError(
        f"unknown language code '{code}' (did you mean '{_closest(code)}'?); "
        "use an NLLB-200 code such as eng_Latn or khk_Cyrl"
    )


def script_of(code: str) -> str:
    """The ISO 15924 script of a language code, e.g. "Cyrl" for khk_Cyrl or mn_MN."""
    nllb = MBART50_TO_NLLB.get(code, code)
    if nllb not in NLLB_CODES:
        raise QeebmError(f"unknown language code '{code}' (did you mean '{_closest(code)}'?)")
    return nllb.split("_", 1)[1]
