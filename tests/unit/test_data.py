import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import logging

import pytest

from qeebm.config import CorpusConfig
from qeebm.data.corpus import Corpus, filter_corpus, read_corpus, write_lines, write_tsv
from qeebm.data.step_sampler import StepSampler
from qeebm.errors import QeebmError


def write_bytes(path, data: bytes):
    path.write_bytes(data)
    return path


def read(path, need_target=True, on_error="fail", **kw):
    return read_corpus(CorpusConfig(path=str(path), **kw), "train", need_target, on_error=on_error)


def expect_error(line, where, **kw):
    """The read fails with one line naming the file ``where`` and its ``line``."""
    with pytest.raises(QeebmError) as err:
        read(**kw)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(where) in msg, msg
    if line is not None:
        assert f"{where}:{line}:" in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------
# Formats


def test_tsv(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", "id\ttgt\tsrc\n1\tbonjour\thello\r\n2\t  sain  \t hi there\n".encode())
    c = read(p)
    assert c.src == ["hello", " hi there"]
    assert c.tgt == ["bonjour", "  sain  "]
    assert c.origin == [f"{p}:2", f"{p}:3"]
    assert c.name == "train" and len(c) == 2


def test_tsv_source_only_and_bom_and_no_final_newline(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", b"\xef\xbb\xbfsrc\tother\na\t\nb\tx")
    c = read(p, need_target=False)
    assert c.src == ["a", "b"] and c.tgt is None


def test_text_is_not_altered(tmp_path):
    # Only "\n" ends a line: other Unicode separators and an inner CR are part of the text.
    p = write_bytes(tmp_path / "c.tsv", "src\ttgt\na\u2028b\tc\rd\n".encode())
    c = read(p)
    assert c.src == ["a\u2028b"] and c.tgt == ["c\rd"]


def test_jsonl_and_json_extension_and_nested_key(tmp_path):
    rows = [{"src": "hello", "tgt": "sain"}, {"src": "b\tc", "tgt": "d", "extra": 1}]
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    c = read(p)
    assert c.src == ["hello", "b\tc"] and c.tgt == ["sain", "d"]
    q = tmp_path / "c.json"
    q.write_text(json.dumps({"translation": {"en": "hi", "mn": "sain"}}) + "\n", encoding="utf-8")
    c = read(q, src_column="translation.en", tgt_column="translation.mn")
    assert c.src == ["hi"] and c.tgt == ["sain"]


def test_text_pair_and_source_only_pool(tmp_path):
    s = write_bytes(tmp_path / "train.en", b"one\ntwo\n")
    t = write_bytes(tmp_path / "train.mn", "neg\r\nhoyor\r\n".encode())
    c = read(s, tgt_path=str(t))  # auto: any extension with tgt_path is a text pair
    assert c.src == ["one", "two"] and c.tgt == ["neg", "hoyor"]
    assert c.origin == [f"{s}:1", f"{s}:2"]
    pool = write_bytes(tmp_path / "mono.txt", b"x\ny\nz\n")
    c = read(pool, need_target=False)
    assert c.src == ["x", "y", "z"] and c.tgt is None


def test_explicit_format_overrides_extension(tmp_path):
    p = write_bytes(tmp_path / "c.data", b'{"src": "a", "tgt": "b"}\n')
    assert read(p, format="jsonl").src == ["a"]


def test_max_examples_keeps_first_and_logs(tmp_path, caplog):
    p = write_bytes(tmp_path / "c.tsv", b"src\ttgt\n" + b"".join(b"s%d\tt%d\n" % (i, i) for i in range(10)))
    with caplog.at_level(logging.INFO, logger="qeebm.data.corpus"):
        c = read(p, max_examples=3)
    assert c.src == ["s0", "s1", "s2"]
    assert "left out 7" in caplog.text


def test_max_examples_does_not_read_past_the_limit(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", b"src\ttgt\na\tb\n\tbad\n")
    assert read(p, max_examples=1).src == ["a"]


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the file and the line


def test_missing_file(tmp_path):
    for name in ("nope.tsv", "nope.jsonl", "nope.txt"):
        expect_error(None, tmp_path / name, path=tmp_path / name)
    expect_error(None, tmp_path / "nope.xyz", path=tmp_path / "nope.xyz")
    s = write_bytes(tmp_path / "a.txt", b"x\n")
    expect_error(None, tmp_path / "b.txt", path=s, tgt_path=str(tmp_path / "b.txt"))


def test_missing_column_names_existing(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", b"source\ttgt\na\tb\n")
    msg = expect_error(1, p, path=p)
    assert "'src'" in msg and "source, tgt" in msg


def test_text_pair_line_counts(tmp_path):
    s = write_bytes(tmp_path / "a.txt", b"1\n2\n3\n")
    t = write_bytes(tmp_path / "b.txt", b"1\n2")
    msg = expect_error(None, s, path=s, tgt_path=str(t))
    assert str(t) in msg and "3" in msg and "2" in msg
    with pytest.raises(QeebmError):  # structural: never skipped
        read(s, tgt_path=str(t), on_error="skip")


def test_source_only_text_where_pairs_are_needed(tmp_path):
    s = write_bytes(tmp_path / "a.txt", b"1\n")
    msg = expect_error(None, s, path=s)
    assert "tgt_path" in msg


@pytest.mark.parametrize(
    "content,line,words",
    [
        (b"src\ttgt\na\tb\n\tc\n", 3, "empty source"),
        (b"src\ttgt\na\tb\nc\t   \n", 3, "empty target"),
        (b"src\ttgt\na\tb\nc\td\xff\xfe\n", 3, "invalid UTF-8"),
        (b"src\ttgt\na\tb\nc\td\te\n", 3, "expected 2"),
        (b"src\ttgt\na\tb\nc\n", 3, "found 1"),
        (b"src\ttgt\na\tb\n\n", 3, "blank line"),
        (b"src\ttgt\xff\na\tb\n", 1, "invalid UTF-8"),
    ],
)
def test_tsv_bad_lines(tmp_path, content, line, words):
    p = write_bytes(tmp_path / "c.tsv", content)
    assert words in expect_error(line, p, path=p)


@pytest.mark.parametrize(
    "content,line,words",
    [
        (b'{"src": "a", "tgt": "b"}\n{"src": "a", "tgt": \n', 2, "invalid JSON"),
        (b'{"src": "a", "tgt": "b"}\n["a", "b"]\n', 2, "not a JSON object"),
        (b'{"src": "a", "tgt": "b"}\n{"src": "a", "target": "b"}\n', 2, "no key 'tgt'"),
        (b'{"src": "a", "tgt": "b"}\n{"src": "a", "tgt": 3}\n', 2, "non-string"),
        (b'{"src": "a", "tgt": "b"}\n{"src": "a", "tgt": null}\n', 2, "non-string"),
        (b'{"src": "a", "tgt": "b"}\n{"src": " ", "tgt": "b"}\n', 2, "empty source"),
        (b'{"src": "a", "tgt": "b"}\n{"src": "a\xc3", "tgt": "b"}\n', 2, "invalid UTF-8"),
    ],
)
def test_jsonl_bad_lines(tmp_path, content, line, words):
    p = write_bytes(tmp_path / "c.jsonl", content)
    assert words in expect_error(line, p, path=p)


def test_json_array_gets_a_hint(tmp_path):
    p = write_bytes(tmp_path / "c.json", b'[\n{"src": "a", "tgt": "b"}\n]\n')
    assert "JSON Lines" in expect_error(1, p, path=p)


def test_text_pair_bad_lines_name_the_right_file(tmp_path):
    s = write_bytes(tmp_path / "a.txt", b"1\n2\n3\n")
    t = write_bytes(tmp_path / "b.txt", b"1\n\n3\n")
    assert "empty target" in expect_error(2, t, path=s, tgt_path=str(t))
    t.write_bytes(b"1\n2\n\x80\n")
    assert "invalid UTF-8" in expect_error(3, t, path=s, tgt_path=str(t))
    s.write_bytes(b"1\n \n3\n")
    t.write_bytes(b"1\n2\n3\n")
    assert "empty source" in expect_error(2, s, path=s, tgt_path=str(t))


@pytest.mark.parametrize("name,content", [("c.tsv", b"src\ttgt\n"), ("c.tsv", b""), ("c.jsonl", b""), ("c.txt", b"")])
def test_empty_corpus(tmp_path, name, content):
    p = write_bytes(tmp_path / name, content)
    expect_error(None, p, path=p, need_target=not name.endswith(".txt"))


# ---------------------------------------------------------------------------------------------
# Skip mode


def test_skip_counts_logs_and_keeps_good_lines(tmp_path, caplog):
    p = write_bytes(
        tmp_path / "c.tsv",
        b"src\ttgt\n"
        b"a\tA\n"  # 2
        b"\tB\n"  # 3 empty source
        b"c\t\n"  # 4 empty target
        b"d\tD\tx\n"  # 5 wrong field count
        b"e\t\xff\n"  # 6 invalid UTF-8
        b"f\tF\n"  # 7
        b"g\t \n",  # 8 empty target
    )
    with caplog.at_level(logging.INFO, logger="qeebm.data.corpus"):
        c = read(p, on_error="skip")
    assert c.src == ["a", "f"] and c.tgt == ["A", "F"]
    assert c.origin == [f"{p}:2", f"{p}:7"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "skipped 5" in msg
    assert f"2 empty target (first at {p}:4)" in msg
    assert f"1 empty source (first at {p}:3)" in msg
    assert f"1 wrong number of fields (first at {p}:5)" in msg
    assert f"1 invalid UTF-8 (first at {p}:6)" in msg


def test_skip_jsonl(tmp_path, caplog):
    p = write_bytes(tmp_path / "c.jsonl", b'{"src": "a", "tgt": "b"}\nnot json\n[1]\n{"src": "c", "tgt": "d"}\n')
    with caplog.at_level(logging.WARNING, logger="qeebm.data.corpus"):
        c = read(p, on_error="skip")
    assert c.src == ["a", "c"]
    assert "skipped 2" in caplog.text and f"{p}:2" in caplog.text


def test_skip_everything_is_still_an_error(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", b"src\ttgt\n\ta\n")
    with pytest.raises(QeebmError, match="no examples"):
        read(p, on_error="skip")


def test_skip_does_not_hide_missing_column(tmp_path):
    p = write_bytes(tmp_path / "c.tsv", b"a\tb\nx\ty\n")
    with pytest.raises(QeebmError, match="no column 'src'"):
        read(p, on_error="skip")


# ---------------------------------------------------------------------------------------------
# Filters


def test_filter_counts_exactly(caplog):
    c = Corpus(
        src=["a b", "a b", "a b c d", "x", "x", "x", "y"],
        tgt=["A", "A", "A", "X1", "X2", "X1", "Y Y Y Y"],
        origin=[f"f:{i}" for i in range(7)],
        name="train",
    )
    count = lambda texts: [len(t.split()) for t in texts]  # noqa: E731
    with caplog.at_level(logging.INFO, logger="qeebm.data.corpus"):
        out = filter_corpus(
            c, max_tokens=3, dedup=True, count_src=count, count_tgt=count, log=logging.getLogger("qeebm.data.corpus")
        )
    assert out.src == ["a b", "x", "x"]
    assert out.tgt == ["A", "X1", "X2"]
    assert out.origin == ["f:0", "f:3", "f:4"]
    assert "train: kept 3 of 7 (dropped 2 too long, 2 duplicates)" in caplog.text


def test_filter_no_limit_no_dedup_and_source_only(caplog):
    c = Corpus(src=["a", "a", "b c d"], tgt=None, origin=["1", "2", "3"], name="mono")
    called = []
    with caplog.at_level(logging.INFO, logger="qeebm.data.corpus"):
        out = filter_corpus(c, max_tokens=0, dedup=False, count_src=lambda t: called.append(t) or [], count_tgt=None)
    assert out.src == ["a", "a", "b c d"] and out.tgt is None and not called
    assert "mono: kept 3 of 3 (dropped 0 too long, 0 duplicates)" in caplog.text
    out = filter_corpus(c, max_tokens=1, dedup=True, count_src=lambda t: [len(x.split()) for x in t], count_tgt=None)
    assert out.src == ["a"]


def test_filter_everything_is_an_error():
    c = Corpus(src=["a b c"], tgt=["x"], origin=["1"], name="train")
    with pytest.raises(QeebmError, match="no examples left"):
        filter_corpus(c, max_tokens=1, dedup=True, count_src=lambda t: [3], count_tgt=lambda t: [1])


# ---------------------------------------------------------------------------------------------
# StepSampler


def test_sampler_is_deterministic():
    a, b = StepSampler(10, 4, seed=1), StepSampler(10, 4, seed=1)
    assert [a.global_indices(s) for s in range(8)] == [b.global_indices(s) for s in reversed(range(8))][::-1]
    assert StepSampler(10, 4, seed=2).global_indices(0) != a.global_indices(0) or (
        StepSampler(10, 4, seed=2).global_indices(1) != a.global_indices(1)
    )


def test_each_epoch_is_a_permutation():
    n, batch = 10, 4  # steps straddle epoch boundaries
    s = StepSampler(n, batch, seed=0)
    stream = [i for step in range(15) for i in s.global_indices(step)]  # 60 positions = 6 epochs
    epochs = [stream[e * n : (e + 1) * n] for e in range(6)]
    for ep in epochs:
        assert sorted(ep) == list(range(n))
    assert len({tuple(ep) for ep in epochs}) > 1
    big = StepSampler(3, 8, seed=0)  # a step longer than an epoch
    assert sorted(big.global_indices(0)[:3]) == [0, 1, 2]
    assert sorted(big.global_indices(0)[3:6]) == [0, 1, 2]


def test_local_slices_tile_the_global_list():
    s = StepSampler(37, 12, seed=3)
    for world, accum in [(1, 1), (2, 1), (1, 3), (2, 3), (3, 2), (4, 3)]:
        for step in (0, 5):
            parts = [s.local_indices(step, m, r, world, accum) for m in range(accum) for r in range(world)]
            assert [i for p in parts for i in p] == s.global_indices(step)
    g = s.global_indices(4)
    assert s.local_indices(4, 0, 0, 2, 1) == g[:6]
    assert s.local_indices(4, 0, 1, 2, 1) == g[6:]
    # One process accumulating two micro-steps sees what two processes see.
    assert s.local_indices(4, 0, 0, 1, 2) == s.local_indices(4, 0, 0, 2, 1)
    assert s.local_indices(4, 1, 0, 1, 2) == s.local_indices(4, 0, 1, 2, 1)


def test_far_step_is_computed_directly():
    s = StepSampler(1000, 16, seed=0)
    # Walking 10**12 steps would never return; the step's indices come from the step alone.
    far = s.global_indices(10**12)
    assert len(far) == 16 and all(0 <= i < 1000 for i in far)
    assert far == StepSampler(1000, 16, seed=0).global_indices(10**12)
    assert s.epoch_of(10**12) == pytest.approx(10**12 * 16 / 1000)
    assert s.epoch_of(0) == 0.0


def test_divisibility_and_argument_errors():
    s = StepSampler(10, 6, seed=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        s.local_indices(0, 0, 0, world=2, accum=2)
    with pytest.raises(ValueError):
        s.local_indices(0, 2, 0, world=1, accum=2)
    with pytest.raises(ValueError):
        StepSampler(0, 4, seed=0)
    with pytest.raises(ValueError):
        s.global_indices(-1)


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets saved locally


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    flat = root / "flat"
    flat_ds = datasets.Dataset.from_dict({"src": ["a", "b", "c"], "tgt": ["A", "B", "C"], "n": [1, 2, 3]})
    flat_ds.save_to_disk(str(flat))
    nested = root / "nested"
    pairs = [{"en": "hi", "mn": "sain"}, {"en": "yes", "mn": "tiim"}]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"translation": pairs}),
            "validation": datasets.Dataset.from_dict({"translation": [{"en": "no", "mn": " "}]}),
        }
    ).save_to_disk(str(nested))
    return flat, nested


def test_hf_local_dataset(hf_dirs):
    flat, _ = hf_dirs
    c = read(flat)  # auto: a directory
    assert c.src == ["a", "b", "c"] and c.tgt == ["A", "B", "C"]
    assert c.origin[1] == f"{flat}:1"
    assert read(flat, need_target=False, format="hf").tgt is None


def test_hf_dataset_dict_nested_translation(hf_dirs):
    _, nested = hf_dirs
    c = read(nested, split="train", src_column="translation.en", tgt_column="translation.mn")
    assert c.src == ["hi", "yes"] and c.tgt == ["sain", "tiim"]
    assert c.origin == [f"{nested}[train]:0", f"{nested}[train]:1"]


def test_hf_max_examples(hf_dirs, caplog):
    flat, _ = hf_dirs
    with caplog.at_level(logging.INFO, logger="qeebm.data.corpus"):
        c = read(flat, max_examples=2)
    assert c.src == ["a", "b"] and "left out 1" in caplog.text


def test_hf_errors(hf_dirs, tmp_path):
    flat, nested = hf_dirs
    msg = expect_error(None, flat, path=flat, src_column="source")
    assert "src, tgt, n" in msg
    cols = dict(src_column="translation.en", tgt_column="translation.mn")
    msg = expect_error(None, nested, path=nested, split="test", **cols)
    assert "train, validation" in msg
    msg = expect_error(None, nested, path=nested, src_column="translation.de", tgt_column="translation.mn")
    assert "en, mn" in msg
    msg = expect_error(None, nested, path=nested, split="validation", **cols)
    assert f"{nested}[validation]:0: empty target" in msg
    assert "non-string" in expect_error(None, flat, path=flat, tgt_column="n")
    empty_dir = tmp_path / "not_a_dataset"
    empty_dir.mkdir()
    expect_error(None, empty_dir, path=empty_dir)


def test_hf_hub_name_offline_is_a_one_line_error():
    with pytest.raises(QeebmError) as err:
        read_corpus(CorpusConfig(path="no-such-user/no-such-dataset", format="hf"), "train", True)
    assert "no-such-user/no-such-dataset" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Writing


def test_write_round_trip_and_atomic(tmp_path):
    p = tmp_path / "sub" / "c.tsv"
    write_tsv(p, ["a b", "ü\u2028"], ["A", " B "])
    c = read(p)
    assert c.src == ["a b", "ü\u2028"] and c.tgt == ["A", " B "]
    q = tmp_path / "m.txt"
    write_lines(q, ["x", "y"])
    assert q.read_bytes() == b"x\ny\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.txt", "sub"]


@pytest.mark.parametrize("bad", ["a\tb", "a\nb", "a\r"])
def test_write_rejects_separators(tmp_path, bad):
    p = tmp_path / "c.tsv"
    write_tsv(p, ["old"], ["OLD"])
    with pytest.raises(QeebmError, match="tab or line break"):
        write_tsv(p, ["ok", bad], ["ok", "ok"])
    with pytest.raises(QeebmError, match="tab or line break"):
        write_lines(tmp_path / "m.txt", [bad])
    assert read(p).src == ["old"]  # the old file is untouched
    assert not (tmp_path / "m.txt").exists()
