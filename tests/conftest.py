import lzma
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

TEST_DATA = Path(__file__).resolve().parent / "data"
MOONCAKE_SAMPLE_XZ = TEST_DATA / "mooncake_synthetic_trace.jsonl.xz"


@pytest.fixture(scope="session")
def mooncake_sample(tmp_path_factory) -> Path:
    """Mooncake's public trace (tests/data/README.md), decompressed once per session: the
    importer reads plain JSONL, and the shipped copy is compressed to stay small."""
    path = tmp_path_factory.mktemp("mooncake") / "mooncake_synthetic_trace.jsonl"
    path.write_bytes(lzma.decompress(MOONCAKE_SAMPLE_XZ.read_bytes()))
    return path
