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


def measure_quick_profile(out: Path) -> Path:
    """``ragsim profile --quick`` of a scaled-down Mistral-7B on one CPU thread into ``out`` (a
    few minutes on two cores); what it printed is kept next to it (``printed.txt``)."""
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["profile", "--model", "mistral-7b", "--layers", "2",
                                      "--hidden", "256", "--device", "cpu", "--quick",
                                      "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (out.parent / "printed.txt").write_text(result.output)
    return out


@pytest.fixture(scope="session")
def quick_profile(tmp_path_factory) -> Path:
    """A quick CPU profile (``measure_quick_profile``), measured once per session: the
    profiler's tests check it, and the real-engine validation runs on it (a profile measured on
    the machine that runs the engine, minutes before)."""
    return measure_quick_profile(tmp_path_factory.mktemp("profile") / "cpu.json")


@pytest.fixture(scope="session")
def tiny_torch_profile(tmp_path_factory) -> Path:
    """A torch profile of a one-layer, 128-wide model on a tiny plan (seconds): every phase of
    the profiler runs, so the tests of its terms (first-time prices, the first decode step
    after prompts) check one run's raw rows against its terms."""
    from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
    from ragsim.profiles.profiler import ProfilePlan, run_profile

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 16, 64], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12], warmup=0, repetitions=1)
    out = tmp_path_factory.mktemp("tiny_profile") / "p.json"
    run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out)
    return out
