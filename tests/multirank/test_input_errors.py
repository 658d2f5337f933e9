"""Bad input at call time is refused on every rank, with a one-line message, before any byte moves."""

from __future__ import annotations

import pytest
import torch

from seqpar import algorithms
from seqpar.errors import SeqparError


def _call_with(env, algorithm: str, q_shape, kv_shape, dtype_k: str = "float64"):
    q = torch.randn(*q_shape, dtype=torch.float64)
    k = torch.randn(*kv_shape, dtype=getattr(torch, dtype_k))
    v = torch.randn(*kv_shape, dtype=getattr(torch, dtype_k))
    with algorithms.recording() as ledger:
        try:
            attn = algorithms.build_attention(algorithm, causal=True, layout="zigzag",
                                              group=env.group(4))
            attn(q, k, v)
        except SeqparError as err:
            return str(err), ledger.total()
    return None, ledger.total()


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "q_shape", "kv_shape", "dtype_k", "match"), [
    ("ulysses", (1, 8, 6, 4), (1, 8, 6, 4), "float64", "heads=6.*divisible by the world size"),
    ("ring", (1, 0, 4, 4), (1, 0, 4, 4), "float64", "seq_len=0.*positive"),
    ("ring", (1, 8, 4, 4), (1, 6, 4, 4), "float64", "k.shape.*must match q.shape"),
    ("allgather", (1, 8, 4, 4), (1, 8, 4, 4), "float32", "k.dtype.*share one dtype"),
    ("ring", (1, 8, 4, 4), (1, 8, 3, 4), "float64", "kv_heads=3.*divide heads=4"),
    ("ring", (8, 4, 4), (8, 4, 4), "float64", "q.shape.*batch, seq, heads, head_dim"),
])
def test_bad_input_is_refused_before_any_communication(gang, algorithm, q_shape, kv_shape,
                                                       dtype_k, match):
    results = gang.run(_call_with, algorithm, q_shape, kv_shape, dtype_k, size=4)
    for message, bytes_sent in results:
        assert message is not None and "\n" not in message
        assert pytest.importorskip("re").search(match, message), message
        assert bytes_sent == 0


def _unknown_option(env):
    try:
        algorithms.build_attention("ring", causal=True, group=env.group(2), team_size=2)
    except SeqparError as err:
        return str(err)
    return None


@pytest.mark.multirank
def test_unknown_option_names_the_options_the_algorithm_takes(gang):
    for message in gang.run(_unknown_option, size=2):
        assert message is not None and "option='team_size'" in message and "backend" in message
