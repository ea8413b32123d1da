import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def mooncake_sample() -> Path:
    path = SHARED_DATA / "mooncake_synthetic_trace.jsonl"
    if not path.exists():
        pytest.skip("the shared Mooncake sample is not beside this checkout")
    return path
