"""Transfer skipping is on by default exactly where it can save something the papers do not count:
with documents or a window. A plain full or causal call moves the bytes its paper counts, and the
option forces either way."""

import pytest

from seqpar import algorithms
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.layouts import Relation
from seqpar.errors import ConfigError
from seqpar.rules.options import Options

PLAIN, WINDOW, DOCS = Relation(True), Relation(True, None, 8), Relation(False, (0, 5, 64), None)


def test_default_skips_only_with_documents_or_a_window_and_the_option_forces_either_way():
    assert [Options().skips(r) for r in (PLAIN, WINDOW, DOCS)] == [False, True, True]
    assert [Options(skip_transfers=False).skips(r) for r in (PLAIN, WINDOW)] == [False, False]
    assert [Options(skip_transfers=True).skips(r) for r in (PLAIN, WINDOW)] == [True, True]
    with pytest.raises(ConfigError, match="skip_transfers='yes': must be true, false or null"):
        Options(skip_transfers="yes")


@pytest.mark.parametrize("name", ["ring", "burst", "double_ring", "usp"])
def test_default_bytes_of_a_windowed_call_are_net_of_the_skipped_transfers(name):
    shape = AttnShape(batch=1, seq_len=512, heads=4, kv_heads=4, head_dim=8)
    opts = {"usp": {"dhp": 2}, "double_ring": {"inner_ring": 2}}.get(name, {})
    unskipped = algorithms.expected_bytes(name, shape, 4, **opts)
    mask = {"layout": "contiguous", "causal": True, "window": 64}
    windowed = algorithms.expected_bytes(name, shape, 4, **mask, **opts)
    assert sum(windowed.values()) < sum(unskipped.values())
    assert algorithms.expected_bytes(name, shape, 4, **mask, skip_transfers=False,
                                     **opts) == unskipped
    plain = algorithms.expected_bytes(name, shape, 4, layout="zigzag", causal=True, **opts)
    assert plain == unskipped  # the paper's count
