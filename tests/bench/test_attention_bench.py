"""bench.attention: the kernel's side-by-side figures, and that it leaves the native kernel on."""

from __future__ import annotations

import pytest

from bench.attention import call_figures, kernel_figures
from inference import attention, q4mm, rmsnorm, rotary


@pytest.mark.skipif(not q4mm.available(), reason="the native kernels cannot be built here")
def test_kernel_figures_print_both_ways_and_leave_the_native_kernel_on(capsys) -> None:
    kernel_figures([1, 2], [8], batches=1)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("1", "8"), ("2", "8")]
    for _, _, native_us, torch_us, ratio in rows:
        assert float(native_us) > 0 and float(torch_us) > 0
        assert float(ratio) == pytest.approx(float(native_us) / float(torch_us), rel=0.2, abs=0.02)
    assert attention._native_on


@pytest.mark.skipif(not q4mm.available(), reason="the native kernels cannot be built here")
@pytest.mark.parametrize("switch", ["norm", "rotary"])
def test_small_call_figures_print_both_ways_and_leave_the_native_call_on(switch, capsys) -> None:
    call_figures([1, 3], batches=1, switch=switch)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "3"]
    for _, native_us, torch_us, ratio in rows:
        assert float(native_us) > 0 and float(torch_us) > 0
        assert float(ratio) == pytest.approx(float(native_us) / float(torch_us), rel=0.2, abs=0.02)
    assert rmsnorm._native_on and rotary._native_on
