import hashlib
import json

import pytest

from qeebm.config import CorpusConfig
from qeebm.data.corpus import read_corpus
from qeebm.errors import QeebmError
from qeebm.qe.heldout import read_judged
from qeebm.tinyworld.build import build, write_data
from qeebm.tinyworld.world import SIZES, is_built

from support.golden import GOLDEN_DIR, cpu_fingerprint, names_to_write


def manifest_heldout(world) -> int:
    return json.loads((world / "qe/qe_report.json").read_text())["kiwi"]["heldout_rows"]


def corpus(world, name):
    return read_corpus(CorpusConfig(path=str(world / "data" / name)), name, need_target=not name.endswith(".txt"))


def test_micro_world_has_every_artifact(micro_world):
    manifest = json.loads((micro_world / "manifest.json").read_text())
    sizes = SIZES["micro"]
    assert {k: manifest["splits"][k] for k in sizes.splits} == sizes.splits
    for path in ("data/train.tsv", "data/train_all.tsv", "data/dev.tsv", "data/test.tsv", "data/mono.txt",
                 "data/pretrain.tsv", "data/qe.tsv", "data/judge.tsv", "data/qe_heldout.tsv",
                 "tokenizers/xlmr/tokenizer.json", "tokenizers/mbart50/tokenizer.json", "tokenizers/nllb/tokenizer.json",
                 "nllb-base/config.json", "mbart-base/config.json", "qe/heldout.tsv", "qe/kiwi/hparams.yaml"):
        assert path in manifest["files"], path
        assert (micro_world / path).is_file(), path
    assert set(manifest["base_test"]) == {"nllb", "mbart"}
    # The QEs' held-out rows, in the form QE-dynamic's qe.heldout_path reads, as many as they were judged on.
    src, mt, score = read_judged(micro_world / "qe/heldout.tsv")
    assert len(score) == manifest_heldout(micro_world) and all(0.0 <= y <= 1.0 for y in score)
    report = json.loads((micro_world / "qe/qe_report.json").read_text())
    for name in ("kiwi-lowrange", "comet", "judge-lowrange"):
        for key in ("pearson", "spearman", "outputs_pearson", "within_source_pearson", "prefers_reference_over",
                    "top_range"):
            assert key in report[name], (name, key)
    for name in ("kiwi", "judge"):
        for key in ("pearson", "spearman", "prefers_reference_over", "top_range"):
            assert key in report[name], (name, key)
    # The held-out judge is of another seed and size than the Kiwi and the COMET, and of another kind
    # than the Kiwi: reference-based.
    assert report["kiwi"]["kind"] == "kiwi" and report["judge"]["kind"] == report["comet"]["kind"] == "comet"
    for other in ("kiwi", "comet"):
        assert report["judge"]["seed"] != report[other]["seed"] and report["judge"]["shape"] != report[other]["shape"]


def test_the_top_range_stage_trains_the_first_qes_further_on_converged_systems(micro_world):
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer

    report = json.loads((micro_world / "qe/qe_report.json").read_text())
    assert report["kiwi"]["continued_from"] == "kiwi-lowrange" and "continued_from" not in report["judge"]
    judge_rows = (micro_world / "qe/train_judge_top.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert report["judge"]["train_examples"] == len(judge_rows) > 0
    # Their judged rows: the plateau run's checkpoints and the QE-trained systems from its end, every
    # decoding, with the same corruptions, degenerations and references as the first rows.
    lines = (micro_world / "qe/train_qe_top.tsv").read_text(encoding="utf-8").splitlines()[1:]
    origins = {line.split("\t")[4] for line in lines}
    top = SIZES["micro"].top_range
    systems = {o.split("/")[0] for o in origins if "/" in o and not o.startswith(("corrupt", "degenerate"))}
    assert systems == {f"nllb-plateau@{s}" for s in top["checkpoints"]} | {"nllb-qe-ebm", "nllb-reinforce"}
    assert any(o.startswith("corrupt/") for o in origins) and any(o.startswith("degenerate/") for o in origins)
    assert report["kiwi"]["train_examples"] == len(lines)
    # Trained further: the same inputs now score otherwise.
    src, mt = ["the cat sees a dog.", "i am here."], ["муур нохой харна.", "би энд байна."]
    assert QEScorer(load_qe(str(micro_world / "qe/kiwi"))).score(src, mt) != \
        QEScorer(load_qe(str(micro_world / "qe/kiwi-lowrange"))).score(src, mt)
    # The top of the range is at least half of the plateau system's outputs (its median and above).
    for name in ("kiwi", "kiwi-lowrange", "comet"):
        r = report[name]["top_range"]
        assert 0 < r["top"]["rows"] <= r["all"]["rows"]


def test_the_first_qes_keep_their_records_when_the_top_range_stage_runs_again():
    from qeebm.tinyworld.toprange import first_qes_report

    first = {"kiwi": {"seed": 0}, "judge": {"seed": 7919}, "comet": {"seed": 1}}
    renamed = first_qes_report(first)
    assert renamed == {"kiwi-lowrange": {"seed": 0}, "judge-lowrange": {"seed": 7919}, "comet": {"seed": 1}}
    # After the stage: its own kiwi and judge beside the first ones; a second run replaces its own.
    after = renamed | {"kiwi": {"continued_from": "kiwi-lowrange"}, "judge": {"kind": "comet"}}
    assert first_qes_report(after) == renamed


def test_a_micro_world_runs_its_stage_workers_in_this_process_as_a_pool_would():
    import torch

    from qeebm.tinyworld.world import InlineExecutor, stage_pool

    assert isinstance(stage_pool(SIZES["micro"], 2), InlineExecutor) and not SIZES["default"].in_process
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not the workers' 1, whatever this machine's core count

    def worker(x):
        torch.set_num_threads(1)
        if x < 0:
            raise ValueError(f"bad {x}")
        return 2 * x

    with stage_pool(SIZES["micro"], 2) as pool:
        good, bad = pool.submit(worker, 3), pool.submit(worker, -1)
    threads = torch.get_num_threads()
    torch.set_num_threads(before)
    assert good.result() == 6 and threads == 3
    with pytest.raises(ValueError, match="bad -1"):
        bad.result()


def test_top_range_report_of_the_true_quality_is_perfect():
    from qeebm.tinyworld.judged import Judged, quality
    from qeebm.tinyworld.toprange import top_range_report

    ref = "Миний том ногоон аяга ширээн дээр байна."
    words = ref.split()
    rows = []
    for i, src in enumerate(["a", "b", "c"]):
        for k in range(4):
            mt = " ".join(words[:len(words) - k - i % 2])
            rows.append(Judged(src, mt, ref, quality(mt, ref), "nllb-plateau@6/sample"))

    class TrueQuality:
        def score(self, src, mt):
            return [quality(m, ref) for m in mt]

    out = top_range_report(TrueQuality(), rows, "nllb-plateau")
    assert out["all"]["pearson"] == pytest.approx(1.0) and out["all"]["within_source_pearson"] == pytest.approx(1.0)
    assert out["top"]["pearson"] == pytest.approx(1.0) and out["top"]["rows"] >= len(rows) // 2


def test_splits_follow_the_published_protocol_and_never_meet(micro_world):
    # Labelled: the first share of the training pairs; the pool: every training source; dev, test,
    # the bases' corpus and the judged sentences: disjoint from the task's pairs and from each other.
    labelled, every = corpus(micro_world, "train.tsv"), corpus(micro_world, "train_all.tsv")
    pool = corpus(micro_world, "mono.txt")
    assert len(labelled.src) == round(SIZES["micro"].labelled * len(every.src))
    assert labelled.src == every.src[:len(labelled.src)] and pool.src == every.src
    sources = {name: set(corpus(micro_world, f"{name}.tsv").src)
               for name in ("train_all", "dev", "test", "pretrain", "pretrain_dev", "qe", "judge", "qe_heldout")}
    names = list(sources)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not sources[a] & sources[b], (a, b)


def test_the_default_world_labels_a_fifth_and_its_bases_corpus_is_narrow(tmp_path):
    from qeebm.tinyworld.language import is_narrow

    spec = SIZES["default"]
    assert spec.labelled == 0.2
    splits = write_data(tmp_path / "data", 0, spec)
    assert len(splits["pretrain"]) == spec.pretrain
    assert all(is_narrow(p, spec.common_fraction) for p in splits["pretrain"])
    # Most task sentences use a word the bases never saw.
    assert sum(is_narrow(p, spec.common_fraction) for p in splits["test"]) < 0.2 * len(splits["test"])
    labelled = corpus(tmp_path, "train.tsv")
    assert len(labelled.src) == 0.2 * spec.splits["train"]


def test_judged_rows_come_from_several_systems_and_every_kind(micro_world):
    from qeebm.tinyworld.judged import quality

    src, mt, score = read_judged(micro_world / "qe/heldout.tsv")
    # The held-out rows were scored by the world's judgement against their references.
    ref_of = dict(zip(corpus(micro_world, "qe_heldout.tsv").src, corpus(micro_world, "qe_heldout.tsv").tgt))
    assert all(abs(quality(m, ref_of[s]) - y) < 1e-12 for s, m, y in zip(src, mt, score))
    log = json.loads((micro_world / "build_log.json").read_text())
    assert log["qe_source"] == "built"


def test_quality_punishes_additions_as_it_punishes_omissions():
    from qeebm.tinyworld.judged import quality

    ref = "Миний том ногоон аяга ширээн дээр байна."
    assert quality(ref, ref) == 1.0
    # chrF++ (beta 2) gives a reference said twice 0.83; this judgement a third.
    assert quality(f"{ref} {ref}", ref) == pytest.approx(1 / 3, abs=0.01)
    half = "Миний том ногоон"
    assert quality(half, ref) < 0.5 and quality(ref + " ногоон том аяга", ref) < 0.75


GOLDEN_WORLD = GOLDEN_DIR / "micro_world.json"


def world_digests(world) -> dict:
    """The build's manifest with each pickled QE checkpoint's digest replaced by its weights': the
    manifest hashes each file with the world's own path replaced by a placeholder, which does not
    reach that path inside a pickle."""
    import torch

    manifest = json.loads((world / "manifest.json").read_text())
    for key in [k for k in manifest["files"] if k.endswith(".ckpt")]:
        weights = torch.load(world / key, map_location="cpu", weights_only=False)["state_dict"]
        digest = hashlib.sha256()
        for name in sorted(weights):
            digest.update(name.encode() + weights[name].numpy().tobytes())
        manifest["files"][key] = digest.hexdigest()
    return manifest


def test_same_seed_gives_identical_files(micro_world, tmp_path):
    # Trained weights are bitwise the same only on the same kind of CPU, so
    # tests/golden/micro_world.json keeps a manifest per CPU it was written on. On such a CPU the
    # session's build must equal that CPU's, which also pins the world against unintended changes;
    # on another CPU a second build with the same seed must equal the first (30 s more).
    # QEEBM_WRITE_GOLDEN=micro-world writes this CPU's manifest beside the others'; after a change
    # meant to alter the world, delete the file first, so that no other CPU keeps a stale one.
    got = world_digests(micro_world)
    stored = json.loads(GOLDEN_WORLD.read_text())["manifests"] if GOLDEN_WORLD.is_file() else {}
    if names_to_write(("micro-world",)):
        stored[cpu_fingerprint()] = got
        GOLDEN_WORLD.write_text(json.dumps({"manifests": stored}, indent=1, sort_keys=True) + "\n")
    if cpu_fingerprint() in stored:
        want = stored[cpu_fingerprint()]
    else:
        want = world_digests(build(tmp_path / "again", seed=0, size="micro"))
    assert sum(k.endswith(".ckpt") for k in got["files"]) >= 4 and len(got["files"]) > 40
    assert sorted(got["files"]) == sorted(want["files"])
    differ = sorted(k for k in got["files"] if got["files"][k] != want["files"][k])
    assert not differ, differ
    assert got == want


def test_a_finished_build_is_not_redone(micro_world):
    stamp = (micro_world / "manifest.json").stat().st_mtime_ns
    build(micro_world, seed=0, size="micro")
    assert is_built(micro_world)
    assert (micro_world / "manifest.json").stat().st_mtime_ns == stamp


def test_shipped_qes_are_copied_only_into_a_world_built_from_their_inputs(micro_world, tmp_path):
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer
    from qeebm.tinyworld.build import export_qe, shipped_qe_matches
    from qeebm.tinyworld.world import hash_tree

    shipped = export_qe(micro_world, tmp_path / "shipped")
    # Weights and settings only: the tokenizer is the world's own.
    assert not (shipped / "kiwi" / "encoder" / "tokenizer.json").exists()
    world = build(tmp_path / "world", seed=0, size="micro", shipped=shipped)
    assert json.loads((world / "build_log.json").read_text())["qe_source"] == "shipped"
    # The bases are the shipped ones, not retrained: every file as in the world they came from.
    assert not (world / "runs").exists()
    built, copied = hash_tree(micro_world), hash_tree(world)
    assert {k: v for k, v in copied.items() if k.endswith("-base/model.safetensors")} == \
        {k: v for k, v in built.items() if k.endswith("-base/model.safetensors")}
    assert json.loads((world / "manifest.json").read_text())["base_test"] == \
        json.loads((micro_world / "manifest.json").read_text())["base_test"]
    src, mt = ["the cat sees a dog.", "i am here."], ["муур нохой харна.", "би энд байна."]
    for name, ref in (("kiwi", None), ("judge", ["нохой харна.", "би байна."])):
        assert QEScorer(load_qe(str(world / "qe" / name))).score(src, mt, ref) == \
            QEScorer(load_qe(str(micro_world / "qe" / name))).score(src, mt, ref)
    # Another seed's data: the shipped QEs are not this build's.
    assert shipped_qe_matches(shipped, world, seed=1, size="micro") is None
    # A shipped base whose bytes are not those recorded is refused, naming the directory.
    weights = shipped / "bases" / "nllb-base" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(QeebmError, match="bases: the files differ from their digests"):
        build(tmp_path / "world2", seed=0, size="micro", shipped=shipped)
    source = json.loads((shipped / "source.json").read_text())
    source["data_files"]["data/train.tsv"] = "0" * 64
    (shipped / "source.json").write_text(json.dumps(source))
    assert shipped_qe_matches(shipped, world, seed=0, size="micro") is None


def test_the_shipped_qes_were_built_from_this_codes_data_and_tokenizers(tmp_path):
    # The default world's data and tokenizers take seconds to make; the bases (also in the QEs'
    # inputs digest) minutes, so they are checked by every default build instead (copy_shipped_qe).
    from qeebm.tinyworld.build import SHIPPED_QE, write_tokenizers
    from qeebm.tinyworld.world import hash_tree

    source = json.loads((SHIPPED_QE / "source.json").read_text())
    spec = SIZES["default"]
    splits = write_data(tmp_path / "data", source["seed"], spec)
    write_tokenizers(tmp_path / "tokenizers", splits, source["seed"], spec)
    assert {k: v for k, v in hash_tree(tmp_path).items() if k.startswith(("data/", "tokenizers/"))} == source["data_files"]
