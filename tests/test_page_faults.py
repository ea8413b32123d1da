"""The process's page-fault count (``realrun/page_faults.py``), which a real run's summary
carries for its serving and its heap's growth: a first touch of fresh pages must show in it.

Expected value from elsewhere: the number of 4 KiB pages of an anonymous mapping the test
writes one byte of each, huge pages turned off for it (a 2 MiB page would fault once for 512),
each a first touch the kernel must map: at least that many minor faults."""

from __future__ import annotations

import mmap

import pytest

from ragsim.realrun.page_faults import PageFaults

PAGES = 4096


@pytest.mark.skipif(not hasattr(mmap, "MADV_NOHUGEPAGE"), reason="needs Linux's madvise")
def test_a_first_touch_of_fresh_pages_is_counted_page_by_page():
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, PAGES * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_NOHUGEPAGE)
        before = PageFaults.now()
        for index in range(PAGES):
            region[index * page] = 1
        touched = PageFaults.now().since(before)
        # touched again: mapped already, no fault each
        again_before = PageFaults.now()
        for index in range(PAGES):
            region[index * page] = 2
        again = PageFaults.now().since(again_before)
    finally:
        region.close()
    assert touched.minor >= PAGES
    assert again.minor < PAGES // 4
    assert touched.major >= 0 and again.major >= 0
