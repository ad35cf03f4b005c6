import os

# No model hub is reachable in tests or CI; without these, hub lookups retry for minutes.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def micro_world(tmp_path_factory) -> Path:
    """A seconds-long tiny-world build (``--size micro``), shared by the tests that need a whole world."""
    from qeebm.tinyworld.build import build

    return build(tmp_path_factory.mktemp("world") / "tinyworld", seed=0, size="micro")


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one state per process; a test that builds another kind of Accelerator
    (another backend, mixed precision) starts from and leaves a clean one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
