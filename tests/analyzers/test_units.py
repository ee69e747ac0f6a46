"""Time formatting: three significant digits, the right unit, rounding that carries."""
import pytest

from srtscope.analyzers.model.units import fmt_ns, fmt_pct, plural


@pytest.mark.parametrize("ns, text", [
    (None, "-"),
    (0, "0 ns"),
    (850, "850 ns"),
    (999.6, "1.00 us"),            # rounds up into the next unit
    (1_000, "1.00 us"),
    (12_400, "12.4 us"),
    (9_996, "10.0 us"),            # rounding carries a digit: not "10.00 us"
    (123_456, "123 us"),
    (999_960, "1.00 ms"),          # not "1000 us"
    (3_210_000, "3.21 ms"),
    (99_999_999, "100 ms"),        # not "100.0 ms"
    (1_500_000_000, "1.50 s"),
    (-2_500, "-2.50 us"),
])
def test_fmt_ns(ns, text):
    assert fmt_ns(ns) == text


def test_fmt_pct():
    assert fmt_pct(1, 4) == "25.0%" and fmt_pct(1, 0) == "-"


@pytest.mark.parametrize("name, family", [
    ("aten::linear, seq = 47485, op_id = 998869", "aten::linear"),
    ("Copy 190", "Copy #"),
    ("FSDP::pre_forward (blocks.16._checkpoint_wrapped_module), op_id = 5",
     "FSDP::pre_forward (blocks.#._checkpoint_wrapped_module)"),
    ("KernelExecutor::compileFusion", "KernelExecutor::compileFusion"),
])
def test_range_family_drops_instance_numbers(name, family):
    from srtscope.analyzers.model.names import range_family

    assert range_family(name) == family


@pytest.mark.parametrize("n, word, many, text", [
    (0, "step", "", "0 steps"), (1, "step", "", "1 step"), (2, "step", "", "2 steps"),
    (1, "entry", "entries", "1 entry"), (3, "entry", "entries", "3 entries"),
])
def test_plural_agrees_with_its_number(n, word, many, text):
    assert plural(n, word, many) == text
