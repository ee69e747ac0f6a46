"""The slow tier's list names tests that exist: a renamed or removed test is noticed here."""
from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.slow_tier import SLOW_TESTS


@pytest.mark.parametrize("node", sorted(SLOW_TESTS))
def test_each_slow_test_exists(node):
    path, func = node.split("::")
    text = (REPO / path).read_text()
    assert re.search(rf"^def {re.escape(func)}\(", text, re.M), f"{node}: no such test"
