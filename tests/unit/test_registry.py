from __future__ import annotations

import pytest

from seqpar import algorithms
from seqpar.algorithms import AttnShape
from seqpar.errors import ConfigError, SeqparError

SHAPE = AttnShape(batch=1, seq_len=64, heads=8, kv_heads=2, head_dim=16, elem_bytes=2)


def test_ring_and_allgather_analytic_bytes_follow_the_design_table():
    u = 1 * 16 * 16 * 2  # B * s * D * e with s = 64 / 4 (a 2-byte dtype)
    g = 2 * u            # the same in float32: summed gradients travel in the accumulation dtype
    assert algorithms.expected_bytes("ring", SHAPE, 4) == {
        "forward": 3 * 2 * 2 * u, "backward": 3 * 2 * 2 * u + 4 * 2 * 2 * g}
    assert algorithms.expected_bytes("allgather", SHAPE, 4) == {
        "forward": 3 * 2 * 2 * u, "backward": 3 * 2 * 2 * g}
    # grad_dtype='input' sends them in the input dtype: the design table's plain counts
    assert algorithms.expected_bytes("ring", SHAPE, 4, grad_dtype="input") == {
        "forward": 3 * 2 * 2 * u, "backward": (3 + 4) * 2 * 2 * u}
    assert algorithms.expected_bytes("allgather", SHAPE, 4, grad_dtype="input") == {
        "forward": 3 * 2 * 2 * u, "backward": 3 * 2 * 2 * u}


def test_ulysses_bytes_count_replicated_kv_heads():
    u = 1 * 8 * 16 * 2  # s = 64 / 8
    # kv_heads=2 < P=8: K,V replicated to 8 heads; (P-1)/P * (2H + 2*8) * u
    want = 7 * (2 * 8 + 2 * 8) * u // 8
    assert algorithms.expected_bytes("ulysses", SHAPE, 8) == {"forward": want, "backward": want}


@pytest.mark.parametrize(("call", "match"), [
    (lambda: algorithms.get("tree"), "algorithm='tree'"),
    (lambda: algorithms.check("ulysses", AttnShape(1, 48, 8, 2, 16), 3), "heads=8.*divisible.*3"),
    (lambda: algorithms.check("ring", SHAPE, 4, "zigzag", seq_len=1), "option='seq_len'"),
    (lambda: algorithms.check("ring", SHAPE, 5, "zigzag"), "seq_len=64.*multiple of world=5"),
    (lambda: algorithms.check("ring", AttnShape(1, 64, 8, 3, 16), 4), "kv_heads=3.*divide"),
    (lambda: algorithms.check("local", SHAPE, 2), "world=2"),
    (lambda: algorithms.check("ring", SHAPE, 4, "spiral"), "layout='spiral'"),
    (lambda: algorithms.check("usp", AttnShape(1, 64, 6, 6, 16), 4, dhp=4), "heads=6"),
])
def test_bad_configurations_name_field_value_and_rule(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_errors_are_seqpar_errors_on_one_line():
    with pytest.raises(SeqparError) as info:
        algorithms.check("ulysses", SHAPE, 3)
    assert "\n" not in str(info.value)
