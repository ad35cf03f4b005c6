import shutil
import time

import pytest
import torch
import yaml

from qeebm.errors import QeebmError
from qeebm.qe.models import load_qe, qe_kind, save_qe
from qeebm.qe.train import torch_threads

from support.qe import fresh, load_tiny, model_dir, predict, toy_triples
from support.tiny import no_backoff


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny models: one thread is as fast, and two collapse when other jobs share the cores.
    with torch_threads(1):
        yield


@pytest.mark.parametrize("kind", ["kiwi", "comet", "xcomet"])
def test_tiny_model_reloads_identically_through_comet_and_load_qe(kind):
    import comet

    d = model_dir(kind)
    hp = yaml.safe_load((d / "hparams.yaml").read_text())
    assert hp["pretrained_model"] == str(d / "encoder")  # absolute: comet loads it from any cwd
    ours = load_tiny(kind)
    theirs = comet.load_from_checkpoint(str(d / "checkpoints" / "model.ckpt"))
    assert qe_kind(ours) == qe_kind(theirs) == kind
    assert not ours.training
    src, mt, ref = toy_triples(6)
    assert predict(ours, src, mt, ref) == predict(theirs, src, mt, ref)
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), k


def test_kiwi_hparams_follow_cometkiwi():
    hp = yaml.safe_load((model_dir("kiwi") / "hparams.yaml").read_text())
    assert hp["class_identifier"] == "unified_metric"
    assert hp["input_segments"] == ["mt", "src"]
    assert (hp["sent_layer"], hp["layer_transformation"], hp["layer_norm"]) == ("mix", "sparsemax", False)
    assert hp["final_activation"] is None and hp["word_level_training"] is False
    model = load_tiny("kiwi")
    assert not model.requires_references()
    assert model.encoder.max_positions == 256


def test_moved_directory_still_loads_with_load_qe(tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(model_dir("kiwi"), moved)
    stale = tmp_path / "gone"
    # A stale absolute encoder path, as after `mv`: load_qe must use <dir>/encoder instead.
    for f in (moved / "hparams.yaml",):
        f.write_text(f.read_text().replace(str(model_dir("kiwi") / "encoder"), str(stale)))
    ckpt = torch.load(moved / "checkpoints" / "model.ckpt", weights_only=False)
    ckpt["hyper_parameters"]["pretrained_model"] = str(stale)
    torch.save(ckpt, moved / "checkpoints" / "model.ckpt")
    src, mt, ref = toy_triples(4)
    assert predict(load_qe(str(moved)), src, mt) == predict(load_tiny("kiwi"), src, mt)
    # and a .ckpt path works as the model name
    assert qe_kind(load_qe(str(moved / "checkpoints" / "model.ckpt"))) == "kiwi"


def test_save_qe_into_its_own_directory_round_trips(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir("comet"), d)
    model = load_qe(str(d))
    save_qe(model, d)  # overwrites the encoder dir it was loaded from
    src, mt, ref = toy_triples(4)
    assert predict(load_qe(str(d)), src, mt, ref) == predict(load_tiny("comet"), src, mt, ref)


def test_offline_hub_id_without_cache_fails_fast_naming_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(time, "sleep", no_backoff)
    with pytest.raises(QeebmError) as err:
        load_qe("Unbabel/wmt22-cometkiwi-da")
    msg = str(err.value)
    for needed in ("hparams.yaml", "checkpoints/model.ckpt", "microsoft/infoxlm-large", "config.json",
                   "sentencepiece.bpe.model"):
        assert needed in msg


def test_bad_paths_are_user_errors(tmp_path):
    with pytest.raises(QeebmError, match="hparams.yaml"):
        load_qe(str(tmp_path))
    with pytest.raises(QeebmError, match="neither a local path nor a hub id"):
        load_qe(str(tmp_path / "no" / "such" / "dir"))


def test_missing_encoder_dir_is_named(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir("kiwi"), d)
    shutil.rmtree(d / "encoder")
    hp = d / "hparams.yaml"
    hp.write_text(hp.read_text().replace(str(model_dir("kiwi") / "encoder"), str(tmp_path / "gone")))
    with pytest.raises(QeebmError, match="encoder"):
        load_qe(str(d))
    # an explicit encoder_dir fills the gap
    assert qe_kind(load_qe(str(d), encoder_dir=str(model_dir("kiwi") / "encoder"))) == "kiwi"


def test_fresh_is_independent_of_shared():
    a, b = fresh("kiwi"), load_tiny("kiwi")
    assert a is not b


def test_saving_twice_gives_identical_bytes(tmp_path):
    import zipfile

    model = load_tiny("kiwi")
    ckpt = tmp_path / "m" / "checkpoints" / "model.ckpt"
    save_qe(model, tmp_path / "m")
    first = ckpt.read_bytes()
    save_qe(model, tmp_path / "m")  # torch alone would write a fresh random serialization id
    assert ckpt.read_bytes() == first
    with zipfile.ZipFile(ckpt) as zf:
        assert zf.testzip() is None  # CRCs still right
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
