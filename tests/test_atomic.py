"""Files are written whole or not at all."""

from __future__ import annotations

import numpy as np
import pytest

from ragsim.atomic import write_atomically, write_text_atomically


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = write_text_atomically(tmp_path / "summary.json", "old\n")

    def half_then_crash(tmp):
        tmp.write_text("half of a new fi")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, half_then_crash)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_temporary_keeps_the_suffix_so_savez_writes_where_asked(tmp_path):
    target = tmp_path / "part-1.npz"
    write_atomically(target, lambda tmp: np.savez(tmp, x=np.arange(3)))
    assert np.load(target)["x"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["part-1.npz"]


def test_a_replaced_file_keeps_its_mode_and_a_link_keeps_its_target(tmp_path):
    target = write_text_atomically(tmp_path / "config.toml", "a = 1\n")
    target.chmod(0o640)
    link = tmp_path / "latest.toml"
    link.symlink_to(target)
    write_text_atomically(link, "a = 2\n")
    assert link.is_symlink() and target.read_text() == "a = 2\n"
    assert target.stat().st_mode & 0o777 == 0o640
