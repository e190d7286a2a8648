"""One deployment's autoscaling over time: readings in, target and decisions out."""

from __future__ import annotations

from kubeserve.control.autoscaling_state import DeploymentAutoscaler, ReplicaLoad

CONFIG = {
    "min_replicas": 1,
    "max_replicas": 10,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
    "look_back_period_s": 10,
    "metrics_interval_s": 1,
}


def test_the_mean_between_two_reads_counts_a_burst_the_gauge_missed() -> None:
    scaler = DeploymentAutoscaler(CONFIG, now=0.0)
    scaler.record_replica("r1", ReplicaLoad(ongoing=0, ongoing_area=0.0, uptime_s=100.0), 0.0)
    # 4 requests for 5 of the 10 seconds: mean 2, though both reads saw 0 in flight
    scaler.record_replica("r1", ReplicaLoad(ongoing=0, ongoing_area=20.0, uptime_s=110.0), 10.0)
    assert scaler.step(running=1, now=10.0)
    assert scaler.target == 2
    assert scaler.last_load == 2.0
    record = scaler.decisions[-1]
    assert (record.prev_num_replicas, record.curr_num_replicas) == (1, 2)
    assert "Upscaling from 1 to 2" in record.reason


def test_queued_requests_at_callers_add_to_the_load() -> None:
    scaler = DeploymentAutoscaler(CONFIG, now=0.0)
    scaler.record_replica("r1", ReplicaLoad(1, 0.0, 1.0), 0.0)
    scaler.record_replica("r1", ReplicaLoad(1, 1.0, 2.0), 1.0)
    scaler.record_queued("proxy", 3, 0.0)
    scaler.step(running=1, now=1.0)
    assert scaler.target == 4
    assert scaler.detail(running=1)["scaling_status"] == "UPSCALING"
    assert scaler.detail(running=1)["metrics"]["queued_requests"] == 3


def test_scaled_to_zero_a_queued_request_starts_one_replica_at_once() -> None:
    scaler = DeploymentAutoscaler({**CONFIG, "min_replicas": 0, "upscale_delay_s": 60}, now=0.0)
    assert scaler.target == 0
    scaler.record_queued("handle", 1, 5.0)
    assert scaler.step(running=0, now=5.0)
    assert scaler.target == 1


def test_gone_replicas_and_silent_callers_stop_counting() -> None:
    scaler = DeploymentAutoscaler(CONFIG, now=0.0)
    scaler.record_replica("r1", ReplicaLoad(5, 0.0, 1.0), 0.0)
    scaler.record_queued("proxy", 5, 0.0)
    scaler.forget_replicas([])
    scaler.step(running=1, now=30.0)  # the caller's report is older than the look-back period
    assert scaler.last_load == 0.0
    assert scaler.queued_now() == 0


def test_a_new_config_keeps_the_target_within_the_new_bounds() -> None:
    scaler = DeploymentAutoscaler(CONFIG, now=0.0)
    scaler.record_queued("proxy", 6, 0.0)
    scaler.step(running=1, now=0.0)
    assert scaler.target == 6
    scaler.reconfigure({**CONFIG, "max_replicas": 4}, 1.0, None, None)
    assert scaler.target == 4
    scaler.reconfigure({**CONFIG, "max_replicas": 4, "initial_replicas": 2}, 2.0, None, None)
    assert scaler.target == 2
    scaler.reconfigure({**CONFIG, "max_replicas": 4, "initial_replicas": 2}, 3.0, 50, "DOWN")
    assert scaler.target == 2  # max 4 at 50% is 2


def test_a_restarted_owner_adopts_the_running_count_within_the_bounds() -> None:
    scaler = DeploymentAutoscaler({**CONFIG, "max_replicas": 4}, now=0.0)
    scaler.adopt(3)
    assert scaler.target == 3
    scaler.adopt(9)
    assert scaler.target == 4
    assert not scaler.decisions  # nothing was decided: the count was already running


def test_a_request_waiting_with_no_replica_starts_one_even_after_a_report_of_zero() -> None:
    """A caller reported 0 an instant ago (its queue had emptied), then 1: the window's average
    is about 0, but with nothing running whatever waits now decides."""
    scaler = DeploymentAutoscaler({**CONFIG, "min_replicas": 0, "upscale_delay_s": 60}, now=0.0)
    assert scaler.target == 0
    scaler.record_queued("proxy", 0, 10.0)
    scaler.record_queued("proxy", 1, 10.0)
    assert scaler.step(0, 10.0)
    assert scaler.target == 1
