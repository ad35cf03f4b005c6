import os

# No model hub is reachable in tests or CI; without these, hub lookups retry for minutes.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest


def run_root(tmp_path_factory) -> Path:
    """The run's own temporary directory: under pytest-xdist, the one above each worker's."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def micro_world(tmp_path_factory) -> Path:
    """A seconds-long tiny-world build (``--size micro``), shared by the tests that need a whole world
    and, under pytest-xdist, built once for all the workers of a run (the first one builds it, the
    others wait for it). Read-only: a test that needs to change a world builds its own."""
    from filelock import FileLock

    from qeebm.tinyworld.build import build

    root = run_root(tmp_path_factory)
    with FileLock(str(root / "micro-world.lock")):
        return build(root / "micro-world" / "tinyworld", seed=0, size="micro")


@pytest.fixture(scope="session")
def launch_turn(tmp_path_factory):
    """A lock the run's workers share, held while a test's multi-process jobs run: on 2 cores, jobs
    of more processes than cores run several times slower (tests/e2e/test_backends.py), so two such
    jobs never run at once; a worker's in-process tests go on beside one."""
    from filelock import FileLock

    return FileLock(str(run_root(tmp_path_factory) / "launch.lock"))


@pytest.fixture
def one_launch_at_a_time(launch_turn):
    """The test runs while holding ``launch_turn``."""
    with launch_turn:
        yield


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one state per process; a test that builds another kind of Accelerator
    (another backend, mixed precision) starts from and leaves a clean one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def kiwi_world(tmp_path_factory) -> dict:
    """A tiny translator's world with source-only sentences and a tiny random CometKiwi
    (``support.qe.write_kiwi_world``): the qe-ebm and fault tests' runs read it, never write it."""
    from support.qe import write_kiwi_world

    return write_kiwi_world(tmp_path_factory.mktemp("kiwi-world"))


@pytest.fixture
def length_scorer(monkeypatch):
    """Every method's QE is a LengthScorer."""
    from qeebm.methods import common

    from support.qe import LengthScorer

    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: LengthScorer())


# The energy tests' world (support.energy): its Kiwi and translators, loaded once per module because
# tests move them between modes and devices.
@pytest.fixture(scope="module")
def kiwi_path():
    from support.energy import energy_world

    return energy_world().kiwi


@pytest.fixture(scope="module")
def kiwi(kiwi_path):
    from support.energy import load_kiwi

    return load_kiwi(kiwi_path)


@pytest.fixture(scope="module")
def translators():
    from qeebm.config import ModelConfig
    from qeebm.translation.translator import Translator

    from support.energy import FAMILIES, energy_world

    return {fam: Translator.load(ModelConfig(name_or_path=str(energy_world().translators[fam]), dropout=0.0))
            for fam in FAMILIES}
