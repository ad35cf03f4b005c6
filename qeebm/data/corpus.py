"""Corpora: reading and validating them, filtering training pairs, writing them atomically.

A problem with a user's corpus is a one-line ``QeebmError`` naming the file and line
(``data/train.tsv:7: empty target``), raised before any model is loaded. Lines are counted from 1
and a TSV header is line 1; rows of a Hugging Face dataset are counted from 0, as ``ds[i]`` counts
them. Text is never altered beyond dropping the line ending and a leading byte-order mark.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from qeebm.config import CHOICES, CORPUS_FORMATS, CorpusConfig
from qeebm.errors import QeebmError, first_line

LOG = logging.getLogger("qeebm.data.corpus")

ON_ERROR = CHOICES["data.on_error"]


@dataclass
class Corpus:
    """Parallel sentences (``tgt`` is None for a source-only pool). ``origin[i]`` says where
    example ``i`` came from (``file:line`` or ``dataset[split]:row``) so later messages can point
    at it; ``name`` (train, dev, ...) prefixes log lines."""

    src: list[str]
    tgt: Optional[list[str]]
    origin: list[str]
    name: str = ""

    def __len__(self) -> int:
        return len(self.src)


# ----------------------------------------------------------------------------------------------
# Bad lines


class _Problems:
    """In "fail" mode the first bad line is the error; in "skip" mode bad lines are dropped, counted
    per reason and reported together in one warning, so a dirty corpus is never silently shrunk."""

    def __init__(self, on_error: str):
        if on_error not in ON_ERROR:
            raise QeebmError(f"on_error must be one of {', '.join(ON_ERROR)}; got {on_error!r}")
        self.skip = on_error == "skip"
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def bad(self, origin: str, reason: str, detail: str = "") -> None:
        if not self.skip:
            raise QeebmError(f"{origin}: {reason}" + (f" ({detail})" if detail else ""))
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.first.setdefault(reason, origin)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self, name: str, log: logging.Logger) -> None:
        if not self.counts:
            return
        parts = ", ".join(f"{n} {reason} (first at {self.first[reason]})" for reason, n in self.counts.items())
        log.warning(f"{name}: skipped {self.total} bad line(s): {parts}")


class _Sink:
    """Accepted examples, up to ``limit`` (0 = all); lines after the limit are only counted."""

    def __init__(self, need_target: bool, limit: int):
        self.need_target = need_target
        self.limit = limit
        self.src: list[str] = []
        self.tgt: list[str] = []
        self.origin: list[str] = []
        self.left_out = 0

    def full(self) -> bool:
        return self.limit > 0 and len(self.src) >= self.limit

    def add(self, problems: _Problems, origin: str, src: str, tgt: Optional[str], tgt_origin: str = "") -> None:
        if not src.strip():
            problems.bad(origin, "empty source")
            return
        if self.need_target:
            assert tgt is not None
            if not tgt.strip():
                problems.bad(tgt_origin or origin, "empty target")
                return
            self.tgt.append(tgt)
        self.src.append(src)
        self.origin.append(origin)


# ----------------------------------------------------------------------------------------------
# Files


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes without the line ending). Bytes, because decoding per line
    is what lets invalid UTF-8 be reported (or skipped) at its line; only ``\\n`` ends a line, so
    other Unicode separators stay inside the text as they are."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if n == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            yield n, raw


def _count_lines(path: Path) -> int:
    """The number of lines ``_lines`` yields, without decoding them."""
    count, last = 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk
    return count + (1 if last and not last.endswith(b"\n") else 0)


def _decode(raw: bytes, origin: str, problems: _Problems) -> Optional[str]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        problems.bad(origin, "invalid UTF-8", f"byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line")
        return None


def _existing_file(path_str: str, name: str) -> Path:
    path = Path(path_str)
    if not path.exists():
        raise QeebmError(f"{name} corpus: file not found: {path}")
    if not path.is_file():
        raise QeebmError(f"{name} corpus: {path} is not a file")
    return path


def _decoded_lines(path: Path, lines: Iterable[tuple[int, bytes]], problems: _Problems,
                   sink: _Sink) -> Iterator[tuple[str, str]]:
    """(origin, text) for each line that is within the limit, valid UTF-8 and not blank; lines past
    the limit are counted in ``sink.left_out``, bad ones go to ``problems``."""
    for n, raw in lines:
        if sink.full():
            sink.left_out += 1
            continue
        origin = f"{path}:{n}"
        text = _decode(raw, origin, problems)
        if text is None:
            continue
        if not text.strip():
            problems.bad(origin, "blank line")
            continue
        yield origin, text


def _read_tsv(cfg: CorpusConfig, name: str, need_target: bool, problems: _Problems, sink: _Sink) -> None:
    path = _existing_file(cfg.path, name)
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise QeebmError(f"{path}: empty file (a TSV corpus starts with a header line naming its columns)")
    try:
        header = first[1].decode("utf-8").split("\t")
    except UnicodeDecodeError:
        raise QeebmError(f"{path}:1: invalid UTF-8 in the header line") from None
    for col in header:
        if header.count(col) > 1:
            raise QeebmError(f"{path}:1: column '{col}' appears more than once in the header")
    wanted = [cfg.src_column] + ([cfg.tgt_column] if need_target else [])
    for col in wanted:
        if col not in header:
            raise QeebmError(f"{path}:1: no column '{col}' in the header (columns: {', '.join(header)})")
    i_src = header.index(cfg.src_column)
    i_tgt = header.index(cfg.tgt_column) if need_target else -1
    for origin, text in _decoded_lines(path, lines, problems, sink):
        fields = text.split("\t")
        if len(fields) != len(header):
            problems.bad(
                origin,
                "wrong number of fields",
                f"expected {len(header)} tab-separated fields as in the header, found {len(fields)}",
            )
            continue
        sink.add(problems, origin, fields[i_src], fields[i_tgt] if need_target else None)


_MISSING = object()


def _lookup(obj: dict, key: str) -> Any:
    """``obj[key]``, or a walk down nested objects for a dotted key (``translation.en``)."""
    if key in obj:
        return obj[key]
    node: Any = obj
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _string_value(value: Any, key: str, obj: Any, origin: str, problems: _Problems) -> Optional[str]:
    if value is _MISSING:
        keys = ", ".join(obj) if isinstance(obj, dict) else ""
        problems.bad(origin, "missing key", f"no key '{key}'; keys: {keys}")
        return None
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        problems.bad(origin, "non-string value", f"'{key}' is {kind}, not a string")
        return None
    return value


def _read_jsonl(cfg: CorpusConfig, name: str, need_target: bool, problems: _Problems, sink: _Sink) -> None:
    path = _existing_file(cfg.path, name)
    for origin, text in _decoded_lines(path, _lines(path), problems, sink):
        # A whole-file JSON array is the usual mistake behind a .json corpus; say so.
        hint = "; the format is JSON Lines, one object per line" if text.lstrip().startswith("[") else ""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            problems.bad(origin, "invalid JSON", f"{err.msg} at column {err.colno}{hint}")
            continue
        if not isinstance(obj, dict):
            problems.bad(origin, "not a JSON object", f"got {type(obj).__name__}{hint}")
            continue
        src = _string_value(_lookup(obj, cfg.src_column), cfg.src_column, obj, origin, problems)
        if src is None:
            continue
        tgt = None
        if need_target:
            tgt = _string_value(_lookup(obj, cfg.tgt_column), cfg.tgt_column, obj, origin, problems)
            if tgt is None:
                continue
        sink.add(problems, origin, src, tgt)


def _read_text(cfg: CorpusConfig, name: str, need_target: bool, problems: _Problems, sink: _Sink) -> None:
    src_path = _existing_file(cfg.path, name)
    if not need_target:
        for n, raw in _lines(src_path):
            if sink.full():
                sink.left_out += 1
                continue
            origin = f"{src_path}:{n}"
            text = _decode(raw, origin, problems)
            if text is not None:
                sink.add(problems, origin, text, None)
        return
    if not cfg.tgt_path:
        raise QeebmError(
            f"{name} corpus needs target sentences but {src_path} is a source-only text file; "
            f"set data.{name}.tgt_path to the file of target lines"
        )
    tgt_path = _existing_file(cfg.tgt_path, name)
    n_src, n_tgt = _count_lines(src_path), _count_lines(tgt_path)
    if n_src != n_tgt:
        raise QeebmError(
            f"{name} corpus: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
            "a text pair needs exactly one target line per source line"
        )
    for (n, raw_src), (_, raw_tgt) in zip(_lines(src_path), _lines(tgt_path)):
        if sink.full():
            sink.left_out += 1
            continue
        origin, tgt_origin = f"{src_path}:{n}", f"{tgt_path}:{n}"
        src = _decode(raw_src, origin, problems)
        if src is None:
            continue
        tgt = _decode(raw_tgt, tgt_origin, problems)
        if tgt is None:
            continue
        sink.add(problems, origin, src, tgt, tgt_origin)


def _nested_keys(feature: Any) -> Optional[list[str]]:
    """The keys a nested column is known to have (a ``Translation`` feature or a dict of
    features), or None when the schema does not say."""
    languages = getattr(feature, "languages", None)
    if isinstance(languages, (list, tuple)) and not hasattr(feature, "num_languages"):
        return list(languages)
    if isinstance(feature, dict):
        return list(feature)
    return None


def _hf_column(ds: Any, col: str, where: str) -> tuple[str, Optional[str]]:
    """(top-level column, key inside it or None) for ``col``, checked against the schema."""
    names = list(ds.column_names)
    if col in names:
        return col, None
    head, _, key = col.partition(".")
    if key and head in names:
        keys = _nested_keys(ds.features[head])
        if keys is not None and key not in keys:
            raise QeebmError(f"{where}: column '{head}' has no key '{key}' (keys: {', '.join(keys)})")
        return head, key
    raise QeebmError(f"{where}: no column '{col}' (columns: {', '.join(names)})")


def _read_hf(cfg: CorpusConfig, name: str, need_target: bool, problems: _Problems, sink: _Sink) -> None:
    import datasets  # slow to import; only HF corpora need it

    if os.path.isdir(cfg.path):
        try:
            ds = datasets.load_from_disk(cfg.path)
        except Exception as err:
            raise QeebmError(
                f"{name} corpus: {cfg.path} is not a dataset directory written by save_to_disk ({first_line(err)})"
            ) from None
        where = cfg.path
        if isinstance(ds, datasets.DatasetDict):
            if cfg.split not in ds:
                raise QeebmError(f"{cfg.path}: no split '{cfg.split}' (splits: {', '.join(ds)})")
            ds = ds[cfg.split]
            where = f"{cfg.path}[{cfg.split}]"
    else:
        try:
            ds = datasets.load_dataset(cfg.path, cfg.hf_config or None, split=cfg.split)
        except Exception as err:
            config = f", config '{cfg.hf_config}'" if cfg.hf_config else ""
            raise QeebmError(
                f"{name} corpus: cannot load Hugging Face dataset '{cfg.path}'{config}, split '{cfg.split}': "
                f"{first_line(err)}"
            ) from None
        where = f"{cfg.path}[{cfg.split}]"
    columns = [(cfg.src_column, *_hf_column(ds, cfg.src_column, where))]
    if need_target:
        columns.append((cfg.tgt_column, *_hf_column(ds, cfg.tgt_column, where)))
    total = len(ds)
    consumed = 0
    # Slices, not whole columns, so max_examples on a large dataset reads only what it keeps.
    while consumed < total and not sink.full():
        rows = ds[consumed : consumed + 10_000]
        for i in range(len(rows[columns[0][1]])):
            if sink.full():
                break
            origin = f"{where}:{consumed}"
            consumed += 1
            values = []
            for full, head, key in columns:
                cell = rows[head][i]
                value = cell if key is None else (_lookup(cell, key) if isinstance(cell, dict) else _MISSING)
                values.append(_string_value(value, full, cell, origin, problems))
            if any(v is None for v in values):
                continue
            sink.add(problems, origin, values[0], values[1] if need_target else None)
    sink.left_out = total - consumed


_READERS: dict[str, Callable[[CorpusConfig, str, bool, _Problems, _Sink], None]] = {
    "tsv": _read_tsv,
    "jsonl": _read_jsonl,
    "text": _read_text,
    "hf": _read_hf,
}


def corpus_format(cfg: CorpusConfig, name: str) -> str:
    """The format ``cfg`` is read as: its ``format``, or for "auto" a guess from the path (a
    directory is a saved HF dataset; .tsv, .jsonl/.json, .txt; any other file with ``tgt_path``
    is a text pair, as in train.en + train.mn)."""
    if cfg.format != "auto":
        if cfg.format not in CORPUS_FORMATS:
            raise QeebmError(f"data.{name}.format must be one of {', '.join(CORPUS_FORMATS)}; got {cfg.format!r}")
        return cfg.format
    path = Path(cfg.path)
    if path.is_dir():
        return "hf"
    ext = path.suffix.lower()
    if ext == ".tsv":
        return "tsv"
    if ext in (".jsonl", ".json"):
        return "jsonl"
    if ext == ".txt" or cfg.tgt_path:
        return "text"
    if not path.exists():
        raise QeebmError(
            f"{name} corpus: file not found: {path} (for a Hugging Face hub dataset set data.{name}.format=hf)"
        )
    raise QeebmError(
        f"{name} corpus: cannot tell the format of {path} from its extension; "
        f"set data.{name}.format to one of {', '.join(_READERS)} (a text pair is found by data.{name}.tgt_path)"
    )


def read_corpus(
    cfg: CorpusConfig,
    name: str,
    need_target: bool,
    on_error: str = "fail",
    log: logging.Logger = LOG,
) -> Corpus:
    """Read and validate one corpus. Without ``need_target`` only sources are read (``tgt`` is
    None), so a pool may come from any parallel file. ``on_error="skip"`` drops bad lines (empty
    side, invalid UTF-8, bad JSON, wrong field count) with one warning; a missing file or column,
    mismatched text-pair lengths and an empty result are errors either way."""
    if not cfg.path:
        raise QeebmError(f"{name} corpus: data.{name}.path is empty")
    fmt = corpus_format(cfg, name)
    if cfg.tgt_path and fmt != "text":
        raise QeebmError(f"{name} corpus: tgt_path is only used by the text format, but {cfg.path} is read as {fmt}")
    if cfg.max_examples < 0:
        raise QeebmError(f"data.{name}.max_examples must be >= 0; got {cfg.max_examples}")
    problems = _Problems(on_error)
    sink = _Sink(need_target, cfg.max_examples)
    _READERS[fmt](cfg, name, need_target, problems, sink)
    problems.report(name, log)
    if not sink.src:
        skipped = f" (all {problems.total} lines were bad and skipped)" if problems.total else ""
        raise QeebmError(f"{name} corpus: {cfg.path} has no examples{skipped}")
    if sink.left_out:
        unit = "rows" if fmt == "hf" else "lines"
        log.info(
            f"{name}: max_examples={cfg.max_examples}: kept the first {len(sink.src)}, "
            f"left out {sink.left_out} further {unit}"
        )
    return Corpus(sink.src, sink.tgt if need_target else None, sink.origin, name)


# ----------------------------------------------------------------------------------------------
# Filters


def filter_corpus(
    c: Corpus,
    *,
    max_tokens: int,
    dedup: bool,
    count_src: Callable[[list[str]], list[int]],
    count_tgt: Optional[Callable[[list[str]], list[int]]] = None,
    log: logging.Logger = LOG,
) -> Corpus:
    """Drop examples with more than ``max_tokens`` tokens on either side (0 = no limit; targets
    are counted with ``count_src`` when ``count_tgt`` is None) and then exact repeats of an earlier
    (source, target) pair. An example that is both counts as too long. Always logs what it did."""
    name = c.name or "corpus"
    n = len(c.src)
    keep = [True] * n
    too_long = 0
    if max_tokens > 0:
        lengths = [count_src(c.src)]
        if c.tgt is not None:
            lengths.append((count_tgt or count_src)(c.tgt))
        for side in lengths:
            if len(side) != n:
                raise ValueError(f"token counter returned {len(side)} counts for {n} texts")
        for i in range(n):
            if any(side[i] > max_tokens for side in lengths):
                keep[i] = False
                too_long += 1
    duplicates = 0
    if dedup:
        seen: set = set()
        for i in range(n):
            if not keep[i]:
                continue
            key = (c.src[i], c.tgt[i] if c.tgt is not None else None)
            if key in seen:
                keep[i] = False
                duplicates += 1
            else:
                seen.add(key)
    idx = [i for i in range(n) if keep[i]]
    out = Corpus(
        [c.src[i] for i in idx],
        [c.tgt[i] for i in idx] if c.tgt is not None else None,
        [c.origin[i] for i in idx],
        c.name,
    )
    log.info(f"{name}: kept {len(out)} of {n} (dropped {too_long} too long, {duplicates} duplicates)")
    if not out.src:
        raise QeebmError(
            f"{name}: no examples left after filtering ({too_long} longer than max_tokens={max_tokens}, "
            f"{duplicates} duplicates); raise data.max_tokens or check the corpus"
        )
    return out


# ----------------------------------------------------------------------------------------------
# Writing


def check_writable(text: Any, path: Path, what: str) -> None:
    if not isinstance(text, str):
        raise QeebmError(f"{path}: {what} is {type(text).__name__}, not a string")
    if "\t" in text or "\n" in text or "\r" in text:
        raise QeebmError(f"{path}: {what} contains a tab or line break, which a TSV/text corpus cannot hold: {text!r}")


def write_atomic(path: Path, lines: Iterable[str]) -> None:
    """Readers never see a half-written corpus: write a sibling temp file, then rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line)
                f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_tsv(
    path: str | os.PathLike, src: Sequence[str], tgt: Sequence[str], columns: tuple[str, str] = ("src", "tgt")
) -> None:
    """A TSV corpus with a header row, readable by ``read_corpus`` with the default columns."""
    path = Path(path)
    if len(src) != len(tgt):
        raise ValueError(f"{path}: {len(src)} sources but {len(tgt)} targets")
    for col in columns:
        check_writable(col, path, f"column name {col!r}")
    for i, (s, t) in enumerate(zip(src, tgt)):
        check_writable(s, path, f"source {i}")
        check_writable(t, path, f"target {i}")
    write_atomic(path, ["\t".join(columns)] + [f"{s}\t{t}" for s, t in zip(src, tgt)])


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    """One text per line (a source-only pool, one side of a text pair, hypotheses)."""
    path = Path(path)
    for i, text in enumerate(lines):
        check_writable(text, path, f"line {i + 1}")
    write_atomic(path, list(lines))
