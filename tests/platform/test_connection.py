"""What reaches every rank: the communication variables of one documented list (no Ray needed)."""

from __future__ import annotations

import secrets

from seqpar.platform import connection


def test_only_the_listed_communication_variables_are_forwarded_and_a_sweeps_win(monkeypatch):
    value = f"eth{secrets.randbelow(100)}"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", value)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("SEQPAR_UNLISTED_PROBE", "x")  # not a communication variable
    env = connection.comm_env({"GLOO_SOCKET_IFNAME": value})
    assert env["NCCL_SOCKET_IFNAME"] == value and env["GLOO_SOCKET_IFNAME"] == value
    assert "SEQPAR_UNLISTED_PROBE" not in env
    assert set(env) <= set(connection.COMM_ENV_VARS)


def test_a_joined_cluster_gets_every_variable_the_embedded_ray_only_the_changed(monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    joined = connection.Connection()  # nothing inherited: every variable travels
    assert {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO"}.items() <= joined.rank_env_vars().items()
    embedded = connection.Connection(embedded=True,  # started with NCCL_IB_HCA, NCCL_DEBUG=WARN
                                     inherited={**connection.comm_env(), "NCCL_DEBUG": "WARN"})
    assert embedded.rank_env_vars() == {"NCCL_DEBUG": "INFO"}
    assert embedded.rank_env_vars({"NCCL_IB_HCA": "mlx5_1"}) == {"NCCL_DEBUG": "INFO",
                                                                 "NCCL_IB_HCA": "mlx5_1"}
