"""The package as users install it: ``pip install .`` (not editable) carries every module and the
files it reads (qeebm/utils/resources.py), and the installed ``qeebm`` works from any directory without
the checkout it was built from."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qeebm.experiments.demo import default_systems
from qeebm.utils import resources

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_config() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_the_package_lists_every_subpackage_and_every_file_it_reads():
    from setuptools import find_packages

    cfg = _setuptools_config()
    data = cfg["package-dir"]
    assert sorted(cfg["packages"]) == sorted(find_packages(str(ROOT), include=["qeebm*"]) + list(data))
    for package, directory in data.items():
        on_disk = {p.relative_to(ROOT / directory).as_posix() for p in (ROOT / directory).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts}
        shipped = {Path(f).relative_to(ROOT / directory).as_posix() for pattern in cfg["package-data"][package]
                   for f in glob.glob(str(ROOT / directory / pattern), recursive=True) if Path(f).is_file()}
        assert on_disk and shipped == on_disk, package
    # In a checkout the package reads the directories themselves.
    assert (resources.CONFIGS, resources.SHIPPED_QE) == (ROOT / "recipes" / "configs", ROOT / "data" / "tinyworld-qe")


def _run(cmd, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_an_installed_package_builds_the_world_and_runs_the_demo_without_the_checkout(micro_world, tmp_path):
    """``pip install .`` into a folder of its own, then from a directory outside the checkout: the
    tiny world's build finds the shipped QEs, and the quick demo trains, evaluates, selects and
    compares, its table against SFT continued with the plateau as a row."""
    # Built from a copy: pip builds in the source tree (build/, *.egg-info), which must not be the checkout.
    src, site, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for directory in ["qeebm", *_setuptools_config()["package-dir"].values()]:
        shutil.copytree(ROOT / directory, src / directory, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "--target", str(site), str(src)], tmp_path, env)
    shutil.rmtree(src)
    # No path back into the checkout: no .pth or egg-link, and no installed file names it.
    assert not list(site.rglob("*.pth")) and not list(site.rglob("*.egg-link"))
    # A console script's shebang names the interpreter that installed it, which may live in the checkout.
    here = str(ROOT).encode()
    def body(p: Path) -> bytes:
        data = p.read_bytes()
        return data.split(b"\n", 1)[-1] if p.parent == site / "bin" and data.startswith(b"#!") else data
    assert not [p for p in site.rglob("*") if p.is_file() and here in body(p)]

    env["PYTHONPATH"] = str(site)
    elsewhere.mkdir()
    where = _run([sys.executable, "-c", "import qeebm, qeebm.utils.resources as r; print(qeebm.__file__, r.CONFIGS, "
                  "r.SHIPPED_QE)"], elsewhere, env).stdout.split()
    assert all(Path(p).is_relative_to(site / "qeebm") and Path(p).exists() for p in where), where

    build = _run([sys.executable, "-m", "qeebm.cli", "tinyworld", "build", "world"], elsewhere, env)
    log = (elsewhere / "world" / "build_log.json").read_text()
    assert '"qe_source": "shipped"' in log and (elsewhere / "world" / "manifest.json").is_file()

    # The README's first command in its quick form: a realistic row and a positive-control one
    # (every system's training is the golden runs' business).
    systems = ["sft", "qe-ebm-static", "qe-ebm-oracle"]
    assert set(systems) <= set(default_systems())
    demo = _run([sys.executable, "-m", "qeebm.cli", "demo", "--quick", "--world", str(micro_world), "--systems",
                 ",".join(systems), "--steps", "2"], elsewhere, env)
    kiwi_table, chrf_table = demo.stdout.split("The same runs, checkpoint selected on dev chrF++ instead")
    rows = [line.split("|")[1].strip() for line in kiwi_table.splitlines() if line.startswith("| ") and "seeds" not in line]
    # Against SFT continued; the plateau every system started from is a row of its own.
    assert rows[:-2] == ["sft (baseline)", "plateau", *systems[1:]], demo.stdout
    best = rows[-2][:-len("+rerank")]
    assert best in systems and rows[-2:] == [f"{best}+rerank", f"{best}+mbr"]
    assert "| sft (baseline) | 1 |" in kiwi_table and "Selection among candidates" in kiwi_table
    assert "| qe-ebm-oracle | 1 |" in chrf_table and "+rerank" not in chrf_table
    # Every system started from the plateau's best dev-chrF++ checkpoint.
    out = elsewhere / "runs" / "demo-quick"
    for name in systems:
        config = yaml.safe_load((out / name / "config.yaml").read_text(encoding="utf-8"))
        assert (elsewhere / config["model"]["name_or_path"]).resolve() == (out / "plateau" / "best").resolve()
    # The smoke run keeps out of the full demo's directory, so the full demo does not try to resume it.
    assert (out / "comparison" / "comparison.csv").is_file() and not (elsewhere / "runs" / "demo").exists()
    assert (out / "comparison" / "plots" / "forest.png").is_file()
    # Quiet in the demo's worker processes too (they inherit the entry point's warning filters).
    assert "pkg_resources" not in build.stderr + demo.stderr
