"""Bottleneck adapters (``model.bottleneck``, the adapters package) on a tiny random mBART: only the
adapter trains, in SFT and in QE-EBM's energy; its checkpoints hold the adapter alone and resume
exactly; a saved translator keeps base and adapter apart and reloads as it was trained; the
reference policy is a frozen copy; NLLB, LoRA at once and a missing package are one-line errors.

The tests that train need the adapters package (``pip install 'qeebm[adapters]'``, in the dev extra)
and skip without it; the errors and the resume of an older run directory are checked without it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.utils import set_seed
from safetensors.torch import load_file as load_safetensors

from qeebm.config import BottleneckConfig, LoraConfig, ModelConfig, load_config
from qeebm.data.corpus import write_lines
from qeebm.errors import QeebmError
from qeebm.methods.common import InitialPolicy
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import train
from qeebm.translation.translator import BOTTLENECK_DIR, BOTTLENECK_NAME, Translator

from support.runs import assert_identical, make_config, read_metrics, write_tiny_world
from support.tiny import tiny_texts, tiny_translator_dir, tokenizer_dir

needs_adapters = pytest.mark.skipif(importlib.util.find_spec("adapters") is None,
                                    reason="the adapters package is not installed (pip install 'qeebm[adapters]')")

# d_model 32 (helpers.TINY_SIZE) / 4: bottlenecks of width 8.
BOTTLENECK = ["model.bottleneck.enabled=true", "model.bottleneck.reduction_factor=4"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def mbart_config(base: Path, run_dir: Path, *overrides: str):
    return make_config(base, run_dir, f"model.name_or_path={tiny_translator_dir('mbart')}", *BOTTLENECK, *overrides)


def is_adapter(key: str) -> bool:
    return BOTTLENECK_NAME in key.split(".")


def initial_state(cfg) -> dict[str, torch.Tensor]:
    """The weights a run starts from: the adapter is drawn after set_seed, as the loop does."""
    set_seed(cfg.seed)
    return {k: v.clone() for k, v in Translator.load(cfg.model).model.state_dict().items()}


def logits(tr: Translator) -> torch.Tensor:
    enc = tr.encode(tiny_texts(6, seed=9)[0::2], tiny_texts(6, seed=9)[1::2])
    with torch.no_grad():
        return tr.model.eval()(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                               decoder_input_ids=enc["decoder_input_ids"]).logits


@needs_adapters
@pytest.mark.parametrize("kind", ["seq_bn", "seq_bn_inv", "double_seq_bn"])
def test_each_kind_adds_only_trainable_bottlenecks(base, tmp_path, kind):
    cfg = mbart_config(base, tmp_path, f"model.bottleneck.kind={kind}")
    tr = Translator.load(cfg.model)
    assert tr.is_bottleneck and tr.adapters_only and not tr.is_lora
    state = tr.model.state_dict(keep_vars=True)
    trainable = sorted(k for k, v in state.items() if v.requires_grad)
    assert trainable == sorted(k for k in state if is_adapter(k))
    # Pfeiffer: after each layer's feed-forward block; Houlsby: after its attention block too; _inv:
    # and an invertible adapter on the encoder's embeddings. Width d_model / reduction_factor.
    assert any(".output_adapters." in k for k in trainable)
    assert any(".attention_adapters." in k for k in trainable) == (kind == "double_seq_bn")
    assert any(".invertible_adapters." in k for k in trainable) == (kind == "seq_bn_inv")
    down = [v for k, v in state.items() if k.endswith("adapter_down.0.weight")]
    assert down and all(v.shape == (8, 32) for v in down)
    # The frozen rest is the base as it was saved; the model is in one mode throughout.
    plain = Translator.load(ModelConfig(name_or_path=cfg.model.name_or_path)).model.state_dict()
    assert sorted(k for k in state if not is_adapter(k)) == sorted(plain)
    assert all(torch.equal(state[k], v) for k, v in plain.items())
    assert len({m.training for m in tr.model.modules()}) == 1


@needs_adapters
def test_gradient_checkpointing_gives_the_adapter_the_same_gradients(base, tmp_path):
    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        cfg = mbart_config(base, tmp_path, "model.dropout=0.0",
                           f"model.gradient_checkpointing={str(checkpointing).lower()}")
        set_seed(cfg.seed)
        tr = Translator.load(cfg.model)
        assert tr.model.is_gradient_checkpointing == checkpointing
        enc = tr.encode(tiny_texts(8, seed=9)[0::2], tiny_texts(8, seed=9)[1::2])
        tr.model.train()(**enc).loss.backward()
        return {n: p.grad for n, p in tr.model.named_parameters() if p.requires_grad}

    plain, recomputed = gradients(False), gradients(True)
    assert plain.keys() == recomputed.keys() and all(g is not None and g.abs().sum() > 0 for g in plain.values())
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@needs_adapters
def test_a_bottleneck_run_trains_only_its_adapter_and_saves_it_beside_the_base(base, tmp_path):
    cfg = mbart_config(base, tmp_path / "run", "optim.max_steps=3", "eval.every=2")
    before = initial_state(cfg)
    result = train(cfg)
    run = Path(cfg.output.run_dir)
    # The checkpoint: exactly the adapter's tensors, every one moved, and the record of the frozen base.
    step = ckpt.step_dir(run / "checkpoints", 3)
    after = ckpt.load_file(step / "model.pt")
    adapter = sorted(k for k in before if is_adapter(k))
    assert adapter and sorted(after) == adapter
    assert [k for k in adapter if torch.equal(before[k], after[k])] == []
    assert json.loads((step / ckpt.BASE).read_text()) == ckpt.base_record(cfg.model.name_or_path)
    # final/ and best/: the base untouched, the adapter beside it, reloaded as trained.
    assert result.best_path == run / "best"
    for out in ("final", "best"):
        saved = load_safetensors(str(run / out / "model.safetensors"))
        assert not any(is_adapter(k) for k in saved)
        assert all(torch.equal(before[k], v) for k, v in saved.items())
        assert (run / out / BOTTLENECK_DIR / "adapter_config.json").is_file()
    final = Translator.load(ModelConfig(name_or_path=str(run / "final")))
    assert final.is_bottleneck and final.base_name_or_path == str(run / "final")
    state = final.model.state_dict()
    assert_identical({k: state[k] for k in adapter}, after)
    assert all(torch.equal(state[k], before[k]) for k in state if not is_adapter(k))
    trained = Translator.load(cfg.model)
    ckpt.load_model(step, trained.model)
    assert torch.equal(logits(final), logits(trained))
    # A run from final/ trains that adapter on, with model.bottleneck on or off, and never LoRA on it.
    more = make_config(base, tmp_path / "more", f"model.name_or_path={run / 'final'}", "optim.max_steps=1")
    assert train(more).step == 1
    moved = ckpt.load_file(ckpt.step_dir(tmp_path / "more" / "checkpoints", 1) / "model.pt")
    assert sorted(moved) == adapter and not any(torch.equal(moved[k], after[k]) for k in adapter)
    with pytest.raises(QeebmError, match="has a bottleneck adapter, which trains on; set model.lora.enabled=false"):
        Translator.load(ModelConfig(name_or_path=str(run / "final"), lora=LoraConfig(enabled=True)))


@needs_adapters
def test_an_interrupted_bottleneck_run_resumes_exactly(base, tmp_path):
    # Dropout stays on (the tiny model's 0.1): the result depends on the restored RNG states.
    common = ["model.dropout=null"]
    train(mbart_config(base, tmp_path / "A", *common, "optim.max_steps=4"))
    assert train(mbart_config(base, tmp_path / "B", *common, "optim.max_steps=2")).step == 2
    assert train(mbart_config(base, tmp_path / "B", *common, "optim.max_steps=4")).step == 4
    for name in ("model.pt", "optimizer.pt", "scheduler.pt"):
        assert_identical(ckpt.load_file(ckpt.step_dir(tmp_path / "A" / "checkpoints", 4) / name),
                         ckpt.load_file(ckpt.step_dir(tmp_path / "B" / "checkpoints", 4) / name), name)
    assert [r["loss"] for r in read_metrics(tmp_path / "B")] == [r["loss"] for r in read_metrics(tmp_path / "A")]
    for name in ("model.safetensors", f"{BOTTLENECK_DIR}/adapter.safetensors"):
        assert_identical(load_safetensors(str(tmp_path / "A" / "final" / name)),
                         load_safetensors(str(tmp_path / "B" / "final" / name)), name)
    # Its checkpoint holds adapters only: a run that trains the whole model does not take it.
    with pytest.raises(QeebmError, match="holds only adapters, trained on .*this run trains the whole model"):
        ckpt.check_base(ckpt.step_dir(tmp_path / "B" / "checkpoints", 4), None)


@needs_adapters
def test_the_initial_policy_of_a_bottleneck_translator_is_a_frozen_copy(base, tmp_path):
    # A fresh bottleneck is not the identity (adapters draws both projections), so disabling it
    # would not give the initial model.
    tr = Translator.load(mbart_config(base, tmp_path).model)
    start = logits(tr)
    initial = InitialPolicy(tr)
    assert initial.copy is not None and not any(p.requires_grad for p in initial.copy.parameters())
    with torch.no_grad():
        for p in tr.model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    assert not torch.allclose(logits(tr), start)
    with initial() as model, torch.no_grad():
        enc = tr.encode(tiny_texts(6, seed=9)[0::2], tiny_texts(6, seed=9)[1::2])
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    decoder_input_ids=enc["decoder_input_ids"]).logits
    assert torch.equal(out, start)


@needs_adapters
def test_the_energy_reaches_every_bottleneck_parameter_and_never_the_qe(base, tmp_path):
    from qeebm.methods import METHODS
    from qeebm.qe.tiny import build_tiny_kiwi
    from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch

    write_lines(tmp_path / "mono.txt", tiny_texts(16, seed=5)[0::2])
    kiwi = build_tiny_kiwi(tmp_path / "kiwi", tokenizer_dir("xlmr"))
    cfg = mbart_config(base, tmp_path / "run", "method=qe-ebm", f"data.mono.path={tmp_path / 'mono.txt'}",
                       f"qe.path={kiwi}", "qe_ebm.sampling.num_samples=2", "qe_ebm.sampling.max_new_tokens=8",
                       "data.dev.path=", "qe_ebm.ce_weight=0.0", "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0")
    set_seed(cfg.seed)
    tr = Translator.load(cfg.model)
    method = METHODS[cfg.method](cfg, tr, tr.model)
    train_set, _ = load_data(cfg, tr)
    idx = list(range(4))
    batch = make_batch(tr, train_set, idx, count_label_tokens(tr, train_set, idx), len(idx), tr.device, step=1)
    batch.mono, batch.global_mono = load_mono(cfg, tr).src[:4], 4
    with torch.no_grad():
        rollout = method.rollout(batch)
    method.loss(rollout).loss.backward()
    adapter = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert adapter and all(is_adapter(n) for n in adapter)
    assert {n for n, p in tr.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0} == adapter
    assert all(p.grad is None for p in method.qe.parameters())


def test_a_run_saved_before_bottleneck_adapters_existed_resumes(base, tmp_path):
    run = tmp_path / "run"
    train(make_config(base, run, "optim.max_steps=2"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    del saved["model"]["bottleneck"]  # as written before the section existed
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert train(make_config(base, run, "optim.max_steps=3")).step == 3


def test_what_cannot_have_a_bottleneck_is_one_line_before_any_weights(monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr("qeebm.translation.translator._load_weights", no_weights)
    on = BottleneckConfig(enabled=True)
    nllb = ModelConfig(name_or_path=str(tiny_translator_dir("nllb")), bottleneck=on)
    with pytest.raises(QeebmError, match="'m2m_100' model: the adapters package has bottleneck adapters for mBART"):
        Translator.load(nllb)
    both = ModelConfig(name_or_path=str(tiny_translator_dir("mbart")), bottleneck=on, lora=LoraConfig(enabled=True))
    with pytest.raises(QeebmError, match="model.lora and model.bottleneck are both enabled"):
        Translator.load(both)
    monkeypatch.setitem(sys.modules, "adapters", None)  # as if not installed
    with pytest.raises(QeebmError, match=r"pip install 'qeebm\[adapters\]'"):
        Translator.load(ModelConfig(name_or_path=str(tiny_translator_dir("mbart")), bottleneck=on))
    with pytest.raises(QeebmError, match="model.bottleneck.kind"):
        load_config(overrides=["model.bottleneck.kind=houlsby"])
