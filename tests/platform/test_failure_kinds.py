"""Which rank's failure is a trial's cause, and its kind, from the errors Ray hands back (no Ray
cluster needed: the exceptions are built by hand)."""

from __future__ import annotations

import pytest
import ray.exceptions as rex
import torch.distributed as dist

from seqpar.workers.result import FailureKind
from seqpar.workers.trial import failure_kind, first_failure


def raised(cause: BaseException) -> rex.RayTaskError:
    return rex.RayTaskError("RankWorker.run_trial", "Traceback ...", cause)


GLOO_ECHO = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                         "[127.0.0.1]:1234: Connection reset by peer")


@pytest.mark.parametrize(("err", "kind"), [
    (raised(ValueError("bad shape")), FailureKind.RANK_RAISED),
    (raised(RuntimeError("CUDA out of memory")), FailureKind.RANK_RAISED),
    (rex.RayActorError(error_msg="The actor died unexpectedly"), FailureKind.RANK_DIED),
    (raised(GLOO_ECHO), FailureKind.RANK_DIED),
    (raised(dist.DistBackendError("NCCL communicator was aborted")), FailureKind.RANK_DIED),
    (raised(dist.DistNetworkError("connect() timed out")), FailureKind.STARTUP),
    (raised(dist.DistStoreError("Timed out waiting for clients")), FailureKind.STARTUP),
    # a package missing on the rank's node: its environment, not the trial's code
    (raised(ModuleNotFoundError("No module named 'flash_attn'")), FailureKind.STARTUP),
])
def test_failure_kind(err, kind):
    assert failure_kind(err) is kind
    assert kind.retryable == (kind is not FailureKind.RANK_RAISED)


def test_the_cause_is_a_death_then_a_rank_s_own_raise_never_its_peers_echo():
    bug, echo = raised(ValueError("bad")), raised(GLOO_ECHO)
    died = rex.RayActorError(error_msg="died")
    assert first_failure({0: echo, 1: bug}) == 1  # rank 0 only felt rank 1's raise
    assert first_failure({0: echo, 2: bug, 3: died}) == 3
    assert first_failure({2: echo, 1: echo}) == 1  # nothing but echoes: the lowest rank
