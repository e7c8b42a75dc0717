from pathlib import Path

import pytest
import torch

from inference import huge_pages

linux = pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").exists(),
    reason="a Linux kernel with transparent huge pages",
)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds `address` (/proc/self/smaps)."""
    inside, flags = False, []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    return flags


@linux
def test_a_large_buffer_is_advised_into_huge_pages_and_keeps_its_contents() -> None:
    kv = torch.empty((30, 2, 3, 4096, 64), dtype=torch.bfloat16)  # a 4,000-token prompt's
    assert huge_pages.advise(kv)
    assert "hg" in _vm_flags(kv.data_ptr() + kv.numel())  # MADV_HUGEPAGE, as smaps says it
    kv.fill_(1.5)
    assert torch.equal(kv, torch.full_like(kv, 1.5))


def test_a_small_buffer_is_left_as_it_is() -> None:
    assert not huge_pages.advise(torch.empty(1000))
