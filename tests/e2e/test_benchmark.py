"""The step benchmark's instruments (qeebm/analysis/benchmark.py): FLOP floors equal hand counts, and phases
are charged exclusive time (on a fake clock)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, XLMRobertaConfig, XLMRobertaModel

import qeebm.analysis.benchmark as bm

from support.tiny import tiny_translator_dir


def test_translator_flops_equal_a_hand_count():
    model = AutoModelForSeq2SeqLM.from_pretrained(str(tiny_translator_dir("nllb")))
    c = model.config
    d, f, v = c.d_model, c.encoder_ffn_dim, c.vocab_size
    enc = c.encoder_layers * (4 * d * d + 2 * d * f)  # q, k, v, out; fc1, fc2 (biases are not matmuls)
    dec = c.decoder_layers * (8 * d * d + 2 * d * f)  # self- and cross-attention; fc1, fc2
    head = d * v
    fwd, bwd = bm.translator_flops(model, enc_tokens=7, dec_tokens=5)
    assert fwd == 2 * (enc * 7 + (dec + head) * 5)
    assert bwd == 2 * fwd  # everything trained: activation and weight gradients
    assert bm.generation_flops(model, src_tokens=7, new_tokens=5) == fwd
    for p in model.parameters():
        p.requires_grad_(False)
    assert bm.translator_flops(model, 7, 5) == (fwd, fwd)  # frozen: activation gradients only


def test_encoder_flops_equal_a_hand_count():
    h, f, layers = 16, 24, 3
    encoder = XLMRobertaModel(XLMRobertaConfig(vocab_size=50, hidden_size=h, num_hidden_layers=layers,
                                               num_attention_heads=2, intermediate_size=f, max_position_embeddings=40))
    per_layer = 4 * h * h + 2 * h * f
    pooler = h * h  # XLM-R's pooler is a linear layer too
    assert bm.linear_params(encoder) == layers * per_layer + pooler
    encoder.requires_grad_(False)
    assert bm.encoder_flops(encoder, 10) == (2 * 10 * (layers * per_layer + pooler),) * 2


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(bm.time, "perf_counter", c)
    return c


def test_phases_are_charged_exclusive_time_and_sampling_absorbs_what_it_calls(clock):
    timer = bm.PhaseTimer()
    work = types.SimpleNamespace()

    def qe(t):
        clock.now += t

    def energy():  # 1 s of its own around a 2 s QE call
        clock.now += 0.5
        work.qe(2.0)
        clock.now += 0.5

    def generate():  # a QE call inside generation is generation's
        work.qe(3.0)

    def step():
        clock.now += 0.25
        work.energy()
        work.generate()

    work.qe, work.energy, work.generate, work.step = qe, energy, generate, step
    timer.wrap(work, "qe", "qe forward", lambda a, k, out: 10.0)
    timer.wrap(work, "energy", "relax+bridge")
    timer.wrap(work, "generate", "sampling")
    timer.wrap_step(work, "step")
    work.step()
    work.step()
    record = timer.steps[0]
    assert record["total"] == 6.25
    assert record["seconds"] == {"other": 0.25, "relax+bridge": 1.0, "qe forward": 2.0, "sampling": 3.0}
    assert record["flops"] == {"qe forward": 10.0}  # the absorbed call counts no floor of its own
    summary = timer.summary(skip=1)
    assert summary["steps"] == 1 and summary["total"] == 6.25 and sum(summary["seconds"].values()) == 6.25
    timer.restore()
    assert work.qe is qe and work.step is step


def test_instrumented_models_still_sample_several_rows_a_source():
    """The timing wrappers keep the wrapped forward's signature: generate checks its keyword
    arguments (the sampler's encoder_outputs) against it."""
    from qeebm.config import GenerationConfig, ModelConfig
    from qeebm.translation.translator import Translator

    tr = Translator.load(ModelConfig(name_or_path=str(tiny_translator_dir("nllb"))))
    enc = tr.encode(["the cat sees 12 dogs.", "a big red house"])
    timer = bm.PhaseTimer()
    bm.instrument(timer)
    try:
        ids = tr.generate_ids(enc["input_ids"], enc["attention_mask"],
                              GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=6), num_return_sequences=3)
    finally:
        timer.restore()
    assert ids.shape[0] == 6


def _thp_mode() -> str | None:
    try:
        return re.search(r"\[(\w+)\]", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()).group(1)
    except OSError:
        return None


def test_importing_qeebm_leaves_the_environment_alone_and_the_cli_turns_on_huge_pages():
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    code = ("import os, qeebm, qeebm.cli, qeebm.training.loop\n"
            "print(os.environ.get('THP_MEM_ALLOC_ENABLE'))\n"
            "qeebm.cli.main(['train', 'optim.lrr=1'])  # a config error: exit code 2 before any work\n"
            "print(os.environ.get('THP_MEM_ALLOC_ENABLE'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "1"]
    out = subprocess.run([sys.executable, "-c", code], env=env | {"THP_MEM_ALLOC_ENABLE": "0"}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["0", "0"]


@pytest.mark.skipif(_thp_mode() is None, reason="no transparent huge pages here")
@pytest.mark.parametrize("setting", [None, "0"])
def test_setup_process_turns_on_torchs_huge_page_allocations_unless_the_user_said_no(setting):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if setting is not None:
        env["THP_MEM_ALLOC_ENABLE"] = setting
    # Under the kernel's "madvise" mode only an allocation torch advised gets huge pages: a touched
    # 64 MB tensor then shows up in the process's AnonHugePages.
    code = ("import os, re, torch\n"
            "from qeebm.utils.process import setup_process\n"
            "setup_process()\n"
            "def huge(): return int(re.search(r'AnonHugePages:\\s+(\\d+)', open('/proc/self/smaps_rollup').read()).group(1))\n"
            "before = huge(); x = torch.ones(1 << 24)\n"
            "print(os.environ['THP_MEM_ALLOC_ENABLE'], huge() - before >= 32 * 1024)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    value, grew = out.stdout.split()
    assert value == ("1" if setting is None else "0")
    if _thp_mode() == "madvise":
        assert grew == str(setting is None)


def test_the_preemption_benchmark_times_a_run_left_at_its_next_micro_step(micro_world, tmp_path):
    """``scripts/bench.py --what preempt``'s worker, here in this process on the micro world with LoRA:
    the signal comes in step 3's first micro-step, so the run stops after step 2, and the record
    describes that stop and its checkpoint. Its times are not asserted: they are docs/performance.md's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parents[2] / "scripts" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        record = bench.preempt_worker(bench.preempt_overrides(micro_world, 2, lora=True), 1, 2 * 2 + 1, 1, str(tmp_path))
    finally:
        torch.set_num_threads(threads)
    assert record["stopped_after"] == 2
    assert 0 <= record["to_stop"] <= record["total"] and 0 <= record["save"] <= record["total"]
    step = tmp_path / "0" / "checkpoints" / "step-0000002"
    assert (step / "base.json").is_file()
    assert record["bytes"] == sum(p.stat().st_size for p in step.iterdir())
