"""dualemb.tf.distribute.recovery against TF's own coordinator classes (no cluster: the real
worker-kill case is tests/tf/distribute/test_tf_distribute_ps.py::test_worker_killed_mid_training_loses_no_row).
"""

import threading
import types

import pytest
from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc

from dualemb.tf.distribute import recovery


def coordinator_with(handler):
    return types.SimpleNamespace(_cluster=types.SimpleNamespace(failure_handler=handler))


@pytest.mark.parametrize("handler_class", [tf_cc.WorkerPreemptionHandler,
                                           tf_cc.CoordinationServicePreemptionHandler])
def test_tf_failure_handlers_keep_the_flag_read(handler_class):
    """Both of TF's failure handlers create the event recovery reads (if TF renames it,
    wait_for_recovery must raise, not wait on nothing)."""
    assert "_cluster_due_for_update_or_finish" in handler_class.__init__.__code__.co_names


def test_waits_until_the_recovery_is_over():
    event = threading.Event()
    event.set()
    coordinator = coordinator_with(types.SimpleNamespace(_cluster_due_for_update_or_finish=event))
    assert recovery.recovery_pending(coordinator)
    threading.Timer(0.3, event.clear).start()
    recovery.wait_for_recovery(coordinator, timeout=30, poll=0.01)
    assert not event.is_set() and not recovery.recovery_pending(coordinator)


def test_a_worker_that_does_not_come_back_raises():
    event = threading.Event()
    event.set()
    coordinator = coordinator_with(types.SimpleNamespace(_cluster_due_for_update_or_finish=event))
    with pytest.raises(TimeoutError, match="has not come back within 0.2 s"):
        recovery.wait_for_recovery(coordinator, timeout=0.2, poll=0.01)


def test_unknown_handler_or_object_raises():
    with pytest.raises(RuntimeError, match="does not expose the recovery flag"):
        recovery.wait_for_recovery(coordinator_with(types.SimpleNamespace()), timeout=1)
    with pytest.raises(TypeError, match="ClusterCoordinator"):
        recovery.wait_for_recovery(object(), timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        recovery.wait_for_recovery(coordinator_with(None), timeout=-1)
    recovery.wait_for_recovery(coordinator_with(None), timeout=0)  # no failure handler: no wait
