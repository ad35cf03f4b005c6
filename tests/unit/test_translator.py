"""Translator: loading, language codes, forced BOS, LoRA save/reload, parity with transformers.pipeline."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from qeebm.config import GenerationConfig, LoraConfig, ModelConfig
from qeebm.errors import QeebmError
from qeebm.translation.translator import Translator, output_rows, translate_file

from support.tiny import make_tiny_translator_dir, tiny_translator_dir

FAMILIES = ["nllb", "mbart"]
SRC = ["the cat sees 12 dogs.", "муур хот", "a big red house and a small river today!"]
TGT = ["муур 12 нохой харж.", "cat city"]
GREEDY = GenerationConfig(num_beams=1, max_new_tokens=10, batch_size=2)
CODES = {"nllb": ("eng_Latn", "khk_Cyrl"), "mbart": ("en_XX", "mn_MN")}


def load(path, **kw) -> Translator:
    return Translator.load(ModelConfig(name_or_path=str(path), **kw))


def perturb_lora(model, seed: int = 0) -> None:
    """LoRA starts as the identity (B = 0); random adapters make a save/reload test mean something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def logits(tr: Translator) -> torch.Tensor:
    tr.model.eval()
    with torch.no_grad():
        return tr.model(**tr.encode(SRC[:2], TGT)).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_load_family_codes_and_encode(family):
    tr = load(tiny_translator_dir(family))
    assert tr.family == family
    assert (tr.src_code, tr.tgt_code) == CODES[family]
    assert tr.tgt_lang_id == tr.tokenizer.convert_tokens_to_ids(tr.tgt_code)
    enc = tr.encode(SRC[:2], TGT)
    src_id = tr.tokenizer.convert_tokens_to_ids(tr.src_code)
    assert (enc["input_ids"][:, 0] == src_id).all()
    assert (enc["labels"][:, 0] == tr.tgt_lang_id).all()
    assert enc["labels"].shape[0] == 2 and (enc["labels"] == -100).any()
    assert not (enc["labels"] == tr.tokenizer.pad_token_id).any()
    for row in enc["labels"]:
        kept = row[row != -100]
        assert kept[-1].item() == tr.tokenizer.eos_token_id
        assert (row[len(kept):] == -100).all()
    counts = tr.num_tokens(TGT, "tgt")
    assert counts == [int((r != -100).sum()) for r in enc["labels"]]
    assert tr.num_tokens(SRC[:2], "src") == enc["attention_mask"].sum(1).tolist()



def test_token_counts_of_overlong_texts_are_whole_and_do_not_warn():
    """The length filter counts texts longer than the model takes in order to drop them: no
    truncation, and no transformers warning that running them through the model would fail."""
    import logging

    tr = load(tiny_translator_dir("nllb"))
    src, tgt = tr.num_tokens(SRC, "src"), tr.num_tokens(TGT, "tgt")
    tr.tokenizer.model_max_length = min(src + tgt) - 1
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.tokenization_utils_base")  # transformers' loggers do not propagate
    logger.addHandler(handler)
    try:
        assert (tr.num_tokens(SRC, "src"), tr.num_tokens(TGT, "tgt")) == (src, tgt)
        assert records == []
        tr.tokenizer(SRC)  # the plain call warns
        assert [r.getMessage()[:34] for r in records] == ["Token indices sequence length is l"]
    finally:
        logger.removeHandler(handler)


def test_mbart_accepts_nllb_and_mbart_codes():
    tr = load(tiny_translator_dir("mbart"), src_lang="en_XX", tgt_lang="khk_Cyrl")
    assert (tr.src_code, tr.tgt_code) == ("en_XX", "mn_MN")
    assert tr.tokenizer.src_lang == "en_XX" and tr.tokenizer.tgt_lang == "mn_MN"


@pytest.mark.parametrize(
    "family,src,tgt",
    [("nllb", "xyz_Latn", "khk_Cyrl"), ("mbart", "eng_Latn", "ace_Latn"), ("mbart", "eng_Latn", "")],
)
def test_unknown_language_codes_are_errors(family, src, tgt):
    with pytest.raises(QeebmError):
        load(tiny_translator_dir(family), src_lang=src, tgt_lang=tgt)


def test_missing_paths_are_one_line_errors(tmp_path):
    with pytest.raises(QeebmError, match="does not exist"):
        load(tmp_path / "nope")
    with pytest.raises(QeebmError, match="does not exist"):
        load("./not-here")
    with pytest.raises(QeebmError, match="no model hub"):
        load("qeebm-test-org/no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(QeebmError, match="empty"):
        load(tmp_path / "empty")


def test_non_translator_model_is_an_error(tmp_path):
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32)
    BartForConditionalGeneration(cfg).save_pretrained(tmp_path / "bart")
    with pytest.raises(QeebmError, match="bart"):
        load(tmp_path / "bart")


def test_dropout_override_reaches_the_layers_and_is_not_saved(tmp_path):
    tr = load(tiny_translator_dir("nllb"), dropout=0.0)
    layer = tr.model.model.encoder.layers[0]
    assert layer.dropout == 0.0 and layer.self_attn.dropout == 0.0
    tr.save(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["dropout"] == 0.1
    assert tr.model.config.dropout == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_bos_overrides_checkpoint_defaults(family, tmp_path):
    tr = load(tiny_translator_dir(family))
    other = tr.tokenizer.convert_tokens_to_ids("ru_RU" if family == "mbart" else "rus_Cyrl")
    assert other != tr.tgt_lang_id
    tr.model.config.forced_bos_token_id = other
    tr.model.generation_config.forced_bos_token_id = other
    # The stale default really is in force without our argument...
    enc = tr.encode(SRC)
    plain = tr.model.generate(**enc, max_new_tokens=3, num_beams=1, do_sample=False)
    assert (plain[:, 1] == other).all()
    # ...and generate_ids / generate override it, for beams and for sampling alike.
    for gen in (GREEDY, GenerationConfig(num_beams=3, max_new_tokens=5), GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=5)):
        ids = tr.generate_ids(enc["input_ids"], enc["attention_mask"], gen, num_return_sequences=1)
        assert (ids[:, 0] == tr.tokenizer.eos_token_id).all()
        assert (ids[:, 1] == tr.tgt_lang_id).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_matches_pipeline(family):
    from transformers import pipeline

    path = str(tiny_translator_dir(family))
    src, tgt = CODES[family]
    pipe = pipeline("translation", model=path, tokenizer=path, src_lang=src, tgt_lang=tgt, device="cpu")
    tr = load(path)
    gen = GenerationConfig(num_beams=1, max_new_tokens=12, batch_size=1)
    ours_text = tr.generate(SRC, gen)
    theirs = pipe(SRC, num_beams=1, max_new_tokens=12, do_sample=False, return_tensors=True)
    for text, out in zip(SRC, theirs):
        enc = tr.encode([text])
        ids = tr.generate_ids(enc["input_ids"], enc["attention_mask"], gen)[0].tolist()
        assert out["translation_token_ids"].tolist()[: len(ids)] == ids
    theirs_text = pipe(SRC, num_beams=1, max_new_tokens=12, do_sample=False)
    assert ours_text == [o["translation_text"] for o in theirs_text]
    # A random tiny model's greedy output is mostly one repeated token; sampling from its near-uniform
    # distributions makes the id-for-id comparison meaningful.
    # Sampling also suppresses special tokens other than </s> (Translator.suppressed_ids): the pipeline
    # gets the same processor.
    # The default sampler is greedy search over processors that draw the token (_Draw); "multinomial"
    # is transformers' sampling with the suppression alone.
    for sampler, do_sample in (("inverse-cdf", False), ("multinomial", True)):
        sample = GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=12, top_k=0, top_p=1.0, batch_size=1,
                                  sampler=sampler)
        kwargs = tr.generation_kwargs(sample)
        assert kwargs["do_sample"] is do_sample
        for text in SRC:
            torch.manual_seed(7)
            ours = tr.generate([text], sample)
            torch.manual_seed(7)
            out = pipe(text, do_sample=do_sample, num_beams=1, max_new_tokens=12, top_k=0, top_p=1.0, temperature=1.0,
                       logits_processor=kwargs["logits_processor"])
            assert ours == [out[0]["translation_text"]], sampler
            assert len(set(ours[0].split())) > 1


@pytest.mark.parametrize("family", FAMILIES)
def test_batching_does_not_change_greedy_output(family):
    tr = load(tiny_translator_dir(family))
    one = tr.generate(SRC, GenerationConfig(num_beams=1, max_new_tokens=10, batch_size=1))
    three = tr.generate(SRC, GenerationConfig(num_beams=1, max_new_tokens=10, batch_size=3))
    assert one == three


def test_sampling_is_reproducible_with_a_seed():
    tr = load(tiny_translator_dir("nllb"))
    gen = GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=10, top_k=0, top_p=1.0, temperature=1.0)
    torch.manual_seed(123)
    a = tr.generate(SRC, gen, num_return_sequences=3)
    torch.manual_seed(123)
    b = tr.generate(SRC, gen, num_return_sequences=3)
    assert a == b and len(a) == 9


def test_generate_restores_training_mode():
    tr = load(tiny_translator_dir("nllb"))
    tr.model.train()
    tr.generate(SRC[:1], GREEDY)
    assert tr.model.training


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_forcing_replays_generated_tokens(family):
    tr = load(tiny_translator_dir(family), dropout=0.0)
    enc = tr.encode(SRC)
    ids = tr.generate_ids(enc["input_ids"], enc["attention_mask"], GREEDY)
    tf = tr.teacher_forcing(ids)
    tr.model.eval()
    with torch.no_grad():
        out = tr.model(**enc, **tf).logits
    # Greedy decoding picks the argmax at every step after the forced language code.
    labels = tf["labels"]
    keep = labels != -100
    keep[:, 0] = False
    if family == "mbart":
        # mBART-50's generation config forces </s> at the length limit, overriding the argmax there.
        keep[:, -1] = False
    assert torch.equal(out.argmax(-1)[keep], labels[keep])
    assert (labels[:, 0] == tr.tgt_lang_id).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_save_reload_and_merge(family, tmp_path):
    base = make_tiny_translator_dir(tmp_path, family)
    lora = LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    tr = load(base, lora=lora)
    trainable = tr.trainable_parameters()
    assert trainable and all("lora_" in n for n, p in tr.model.named_parameters() if p.requires_grad)
    assert tr.parameter_counts()[0] < tr.parameter_counts()[1]
    before = logits(tr)
    perturb_lora(tr.model)
    ref_logits = logits(tr)
    assert not torch.allclose(before, ref_logits)
    ref = tr.generate(SRC, GREEDY)

    tr.save(tmp_path / "adapter", merge_lora=False)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    again = load(tmp_path / "adapter")
    assert again.is_lora and again.trainable_parameters()
    assert torch.equal(logits(again), ref_logits)
    assert again.generate(SRC, GREEDY) == ref

    tr.save(tmp_path / "merged")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert tr.is_lora  # saving a merged copy leaves the training model alone
    merged = load(tmp_path / "merged")
    assert not merged.is_lora
    assert torch.allclose(logits(merged), ref_logits, atol=1e-5)
    assert merged.generate(SRC, GREEDY) == ref


def test_translate_file(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the cat\n\nмуур хот\n", encoding="utf-8")
    out = tmp_path / "sub" / "out.txt"
    n = translate_file(str(tiny_translator_dir("nllb")), "eng_Latn", "khk_Cyrl", src, out, GREEDY)
    assert n == 2
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    tr = load(tiny_translator_dir("nllb"))
    assert [lines[0], lines[2]] == [" ".join(h.split()) for h in tr.generate(["the cat", "муур хот"], GREEDY)]
    with pytest.raises(QeebmError):
        translate_file(str(tiny_translator_dir("nllb")), "eng_Latn", "khk_Cyrl", tmp_path / "missing.txt", out, GREEDY)


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_forcing_starts_every_row_at_the_decoder_start_even_with_a_literal_pad(family):
    # mBART's own shift from labels finds a row's end by counting non-pad tokens: a target holding the
    # text "<pad>" would start its decoder from the wrong token. The decoder inputs are built
    # explicitly: the decoder start, then the labels shifted right.
    tr = load(tiny_translator_dir(family))
    enc = tr.encode(["a cat", "the dog sleeps"], ["x <pad> y", "z"])
    labels, dec = enc["labels"], enc["decoder_input_ids"]
    assert (labels[0] == tr.tokenizer.pad_token_id).any()  # the literal <pad> is in the labels
    assert (dec[:, 0] == tr.model.config.decoder_start_token_id).all()
    assert (dec[:, 1] == tr.tgt_lang_id).all()
    assert torch.equal(dec[:, 1:][labels[:, :-1] != -100], labels[:, :-1][labels[:, :-1] != -100])
    # On a row without a literal <pad> the model's own shift agrees.
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right as m2m_shift
    from transformers.models.mbart.modeling_mbart import shift_tokens_right as mbart_shift

    pad = tr.tokenizer.pad_token_id
    own = (mbart_shift(labels[1:].masked_fill(labels[1:] == -100, pad), pad) if family == "mbart"
           else m2m_shift(labels[1:], pad, tr.model.config.decoder_start_token_id))
    assert torch.equal(own, dec[1:])
    if family == "mbart":
        assert not torch.equal(mbart_shift(labels[:1].masked_fill(labels[:1] == -100, pad), pad), dec[:1])


def test_nucleus_keeps_what_transformers_top_p_keeps():
    from transformers import TopPLogitsWarper

    from qeebm.translation.translator import _Nucleus

    torch.manual_seed(0)
    # Peaked rows (the nucleus is a few tokens) and flat ones (more than the 256 entries searched).
    scores = torch.cat([torch.randn(6, 3000) * 4, torch.randn(2, 3000) * 0.01])
    scores[0, :5] = float("-inf")  # suppressed tokens stay out
    for p in (0.5, 0.9, 0.99):
        ours = _Nucleus(p)(None, scores)
        theirs = TopPLogitsWarper(p)(None, scores)
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), p
        assert torch.equal(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])
    assert torch.isfinite(_Nucleus(0.9)(None, scores)[6:]).sum() > 2 * 256  # the flat rows took the full sort


def test_nucleus_leaves_finished_rows_and_no_other_sample_changes():
    """A row that has emitted </s> is left unfiltered (generate pads it whatever is drawn); the
    other rows are filtered exactly, and a row's draw does not depend on the other rows'
    probabilities, so skipping changes no live row's sample."""
    from qeebm.translation.translator import _Draw, _Nucleus

    torch.manual_seed(0)
    eos = 2
    scores = torch.cat([torch.randn(6, 3000) * 4, torch.randn(2, 3000) * 0.01])
    input_ids = torch.tensor([[eos, 7, 9]] * 8)
    input_ids[[1, 6], 2] = eos  # rows 1 and 6 have finished
    out = _Nucleus(0.9, eos_id=eos)(input_ids, scores)
    every_row = _Nucleus(0.9)(None, scores)
    live = torch.tensor([True, False, True, True, True, True, False, True])
    assert torch.equal(out[~live], scores[~live])
    assert torch.equal(out[live], every_row[live])
    draws = []
    for filtered in (out, every_row):
        torch.manual_seed(1)
        draws.append(_Draw()(None, filtered).argmax(-1))
    assert torch.equal(draws[0][live], draws[1][live])
    assert not torch.equal(out, every_row)  # the finished rows really were skipped


def test_draw_samples_the_softmax_and_never_a_removed_token():
    from qeebm.translation.translator import _Draw

    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    scores = probs.log().expand(40_000, -1).contiguous()  # log 0 = -inf: removed tokens
    torch.manual_seed(0)
    out = _Draw()(None, scores)
    assert torch.equal(torch.isfinite(out).sum(-1), torch.ones(len(out), dtype=torch.long))  # one token a row
    counts = torch.bincount(out.argmax(-1), minlength=6).double()
    assert counts[1] == counts[5] == 0
    # Binomial counts within 4 standard deviations of their means.
    n, sd = len(out), (len(out) * probs.double() * (1 - probs.double())).sqrt()
    assert ((counts - n * probs.double()).abs() <= 4 * sd + 1e-9).all(), counts


def test_blocked_inverse_cdf_is_the_whole_row_search(monkeypatch):
    """The two-level search draws what a search of the whole row's float64 cumulative sum draws from
    the same uniforms: rows with removed tokens, empty blocks, all the mass in the short last block,
    and a vocabulary that is not a multiple of the block."""
    from qeebm.translation.translator import _DRAW_BLOCK, inverse_cdf

    g = torch.Generator().manual_seed(0)
    v = 5 * _DRAW_BLOCK + 7
    scores = torch.randn(3000, v, generator=g) * 3
    scores[torch.rand(scores.shape, generator=g) < 0.3] = float("-inf")
    scores[:500, : 2 * _DRAW_BLOCK] = float("-inf")  # empty leading blocks
    scores[500:1000, : 5 * _DRAW_BLOCK] = float("-inf")  # only the short last block has mass
    scores[500:1000, -1] = 0.0
    probs = scores.softmax(-1)
    torch.manual_seed(7)
    got = inverse_cdf(probs)
    torch.manual_seed(7)
    cdf = probs.double().cumsum(-1)
    want = torch.searchsorted(cdf, torch.rand(len(probs), 1, dtype=torch.float64) * cdf[:, -1:], right=True)
    assert torch.equal(got, want)
    assert bool((probs.gather(-1, got) > 0).all())
    # A uniform at the very top of the range still lands on the last token with mass, not past it:
    # also in rows whose last block sums, one by one, to less than its block sum, where that uniform
    # would search past the block's end.
    top = torch.zeros(1, v)
    top[0, [3, _DRAW_BLOCK + 1]] = 0.5
    p = torch.rand(20000, 2 * _DRAW_BLOCK, generator=g) ** 4
    p = p / p.sum(-1, keepdim=True)
    upto = p.unflatten(-1, (2, _DRAW_BLOCK)).sum(-1, dtype=torch.float64).cumsum(-1)
    one_by_one = upto[:, 0] + p[:, _DRAW_BLOCK:].double().cumsum(-1)[:, -1]
    short = p[one_by_one < torch.nextafter(upto[:, 1], torch.zeros_like(upto[:, 1]))]
    assert len(short) > 0
    monkeypatch.setattr(torch, "rand", lambda *size, dtype=None, device=None: torch.ones(size, dtype=dtype))
    assert inverse_cdf(top).item() == _DRAW_BLOCK + 1
    assert torch.equal(inverse_cdf(short).flatten(), torch.full((len(short),), 2 * _DRAW_BLOCK - 1))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("setting", [dict(), dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.3, epsilon=1e-3)])
def test_inverse_cdf_sampling_is_transformers_sampling_with_that_draw(family, setting, monkeypatch):
    """The default sampler against transformers' own sampling path (its warpers, in its order, and its
    expansion of the sources) with torch.multinomial replaced by the same inverse-CDF draw: the same
    rows, token for token. So the warpers, their order, the nucleus, the suppression and the repeated
    encoder rows are transformers' exactly; only the draw differs from "multinomial"."""
    import transformers.generation.utils as gen_utils

    tr = load(tiny_translator_dir(family))
    enc = tr.encode(SRC)
    ours = GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=12, **setting)
    torch.manual_seed(3)
    a = tr.generate_ids(enc["input_ids"], enc["attention_mask"], ours, num_return_sequences=4)

    from qeebm.translation.translator import inverse_cdf

    monkeypatch.setattr(gen_utils.torch, "multinomial", lambda probs, num_samples: inverse_cdf(probs))
    torch.manual_seed(3)
    b = tr.generate_ids(enc["input_ids"], enc["attention_mask"], dataclasses.replace(ours, sampler="multinomial"),
                        num_return_sequences=4)
    assert a.shape[0] == 3 * 4
    assert len({tuple(row.tolist()) for row in a[:4]}) > 1  # really random: a source's samples differ
    assert torch.equal(a, b)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_keeps_the_gradients(family, lora):
    """Recomputing the layers in the backward pass (train mode, the checkpoint's dropout on) gives
    the gradients of the plain backward pass: checkpointing replays each layer's dropout draws."""
    grads, recomputed = [], []
    for checkpointing in (False, True):
        tr = load(tiny_translator_dir(family), gradient_checkpointing=checkpointing,
                  lora=LoraConfig(enabled=lora, r=4))
        if lora:
            perturb_lora(tr.model)
        tr.model.train()
        calls = []
        layer = next(m for m in tr.model.modules() if type(m).__name__.endswith("DecoderLayer"))
        forward = layer.forward
        layer.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        torch.manual_seed(0)
        loss = tr.model(**tr.encode(SRC[:2], TGT)).loss
        loss.backward()
        recomputed.append(len(calls))  # a checkpointed layer runs again in the backward pass
        grads.append({n: p.grad.clone() for n, p in tr.model.named_parameters() if p.requires_grad})
        torch.manual_seed(1)
        with torch.no_grad():
            other_draw = tr.model(**tr.encode(SRC[:2], TGT)).loss
        # Dropout really is on, so the equality below is a replay of the same draws, not their absence.
        assert (other_draw - loss.detach()).abs() > 1e-4
    assert recomputed == [1, 2]
    plain, checkpointed = grads
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    for name in plain:
        assert (plain[name] - checkpointed[name]).abs().max() < 1e-6, name
    assert max(g.abs().max() for g in plain.values()) > 1e-3


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_output_rows_projects_only_the_kept_positions(family, lora, tmp_path):
    """Logits and parameter gradients equal the full forward's at the kept positions; the hook
    is gone after the block."""
    kw = {"lora": LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"])} if lora else {}
    tr = load(make_tiny_translator_dir(tmp_path, family), dropout=0.0, **kw)
    if lora:
        perturb_lora(tr.model)
    batch = tr.encode(SRC[:2], TGT)
    keep = batch["labels"] != -100
    keep[:, 0] = False  # the language code: a position nobody reads
    weights = torch.randn(int(keep.sum()), generator=torch.Generator().manual_seed(0))
    params = [p for p in tr.model.parameters() if p.requires_grad]

    def run(rows: bool):
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                  "decoder_input_ids": tr.decoder_inputs(batch["labels"])}
        if rows:
            with output_rows(tr.model, keep):
                out = tr.model(**inputs).logits
        else:
            out = tr.model(**inputs).logits[keep]
        loss = (out.log_softmax(-1)[:, 5] * weights).sum()
        return out.detach(), torch.autograd.grad(loss, params)

    full, g_full = run(False)
    rows, g_rows = run(True)
    assert rows.shape == (int(keep.sum()), tr.model.config.vocab_size)
    assert (rows - full).abs().max() < 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(g_full, g_rows)) < 1e-5
    assert tr.model(**{k: batch[k] for k in ("input_ids", "attention_mask")},
                    decoder_input_ids=tr.decoder_inputs(batch["labels"])).logits.dim() == 3
