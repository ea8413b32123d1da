"""Figures: written whole, the same bytes for the same curves, bad suffixes refused early."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.errors import RagsimInputError
from ragsim.figures import new_figure, save_figure
from ragsim.profiles.plots import plot_prefill
from ragsim.profiles.profile import load_profile

runner = CliRunner()


def _line_figure():
    fig = new_figure(3, 2)
    fig.subplots().plot([1, 2, 3], [3, 1, 2])
    return fig


@pytest.mark.parametrize("suffix", ["svg", "pdf", "png"])
def test_save_figure_is_reproducible_and_leaves_no_temporary(tmp_path, suffix):
    a, b = tmp_path / f"a.{suffix}", tmp_path / f"b.{suffix}"
    save_figure(_line_figure(), a)
    save_figure(_line_figure(), b)
    assert a.read_bytes() == b.read_bytes()
    # two saves in one second share a date: check it is left out, not just equal
    assert b"CreationDate" not in a.read_bytes() and b"<dc:date>" not in a.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [a.name, b.name]


def test_a_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "fig.png"
    save_figure(_line_figure(), path)
    before = path.read_bytes()
    fig = _line_figure()

    def broken_savefig(target, **kwargs):
        with open(target, "wb") as f:
            f.write(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(fig, "savefig", broken_savefig)
    with pytest.raises(RagsimInputError, match=r"could not be written \(disk full\)"):
        save_figure(fig, path)  # one line naming the file, not a traceback
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["fig.png"]


def test_prefill_plot_is_reproducible(tmp_path):
    profile = load_profile("a10g-mistral-7b")
    a, b = plot_prefill(profile, tmp_path / "a.svg"), plot_prefill(profile, tmp_path / "b.svg")
    assert a.read_bytes() == b.read_bytes() and b"T(cached, new)" in a.read_bytes()


def test_profiles_show_refuses_a_bad_plot_suffix_before_loading_anything(tmp_path):
    result = runner.invoke(app, ["profiles", "show", "no-such-profile", "--plot",
                                 str(tmp_path / "t.gif")])
    assert result.exit_code == 2
    assert "t.gif" in result.output and "no-such-profile" not in result.output
    assert not (tmp_path / "t.gif").exists()
