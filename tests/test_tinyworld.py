import json

from qeebm.data import read_corpus
from qeebm.config import CorpusConfig
from qeebm.qe.heldout import read_judged
from qeebm.tinyworld.build import SIZES, build, is_built


def manifest_heldout(world) -> int:
    return json.loads((world / "qe/qe_report.json").read_text())["kiwi"]["heldout_examples"]


def test_micro_world_has_every_artifact(micro_world):
    manifest = json.loads((micro_world / "manifest.json").read_text())
    assert manifest["splits"] == SIZES["micro"].splits
    for path in ("data/train.tsv", "data/dev.tsv", "data/test.tsv", "data/mono.txt",
                 "tokenizers/xlmr/tokenizer.json", "tokenizers/mbart50/tokenizer.json", "tokenizers/nllb/tokenizer.json",
                 "nllb-base/config.json", "mbart-base/config.json", "qe/heldout.tsv"):
        assert path in manifest["files"] or (micro_world / path).is_file(), path
        assert (micro_world / path).is_file(), path
    train = read_corpus(CorpusConfig(path=str(micro_world / "data/train.tsv")), "train", need_target=True)
    assert len(train.src) == SIZES["micro"].splits["train"]
    assert set(manifest["base_test"]) == {"nllb", "mbart"}
    # The QEs' held-out rows, in the form QE-dynamic's qe.heldout_path reads, as many as they were judged on.
    src, mt, score = read_judged(micro_world / "qe/heldout.tsv")
    assert len(score) == manifest_heldout(micro_world) and all(0.0 <= y <= 1.0 for y in score)


def test_same_seed_gives_identical_files(micro_world):
    # Rebuilt in the same place (comet's checkpoints hold their encoder's absolute path) over the
    # session's micro world, which is built with the same seed: an identical rebuild leaves it valid.
    first = json.loads((micro_world / "manifest.json").read_text())
    second = json.loads((build(micro_world, seed=0, size="micro", force=True) / "manifest.json").read_text())
    assert first == second
    assert len(first["files"]) > 40


def test_a_finished_build_is_not_redone(micro_world):
    stamp = (micro_world / "manifest.json").stat().st_mtime_ns
    build(micro_world, seed=0, size="micro")
    assert is_built(micro_world)
    assert (micro_world / "manifest.json").stat().st_mtime_ns == stamp
