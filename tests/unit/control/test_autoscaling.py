"""The autoscaling policy against Ray Serve 2.60's documented behaviour."""

from __future__ import annotations

import pytest

from kubeserve.control.autoscaling import (
    AutoscalingConfig,
    PolicyState,
    Sample,
    capacity_adjusted,
    decide,
    initial_target,
    target_capacity_direction,
    total_requests,
)
from kubeserve.control.effective_config import effective_deployment


def config(**fields: object) -> AutoscalingConfig:
    base = {"min_replicas": 1, "max_replicas": 10, "upscale_delay_s": 0, "downscale_delay_s": 0}
    return AutoscalingConfig.from_mapping({**base, **fields})


def step(policy: AutoscalingConfig, running: int, load: float, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "running": running,
        "target": running,
        "load": load,
        "state": PolicyState(),
        "now": 100.0,
    }
    args.update(kw)
    return decide(policy, **args)  # type: ignore[arg-type]


# -- defaults ---------------------------------------------------------------------------------


def test_defaults_are_ray_2_60s() -> None:
    policy = AutoscalingConfig.from_mapping({})
    assert (policy.min_replicas, policy.max_replicas, policy.initial_replicas) == (1, 1, None)
    assert policy.target_ongoing_requests == 2.0
    assert (policy.upscale_delay_s, policy.downscale_delay_s) == (30.0, 600.0)
    assert policy.downscale_to_zero_delay_s is None
    assert (policy.metrics_interval_s, policy.look_back_period_s) == (10.0, 30.0)
    assert (policy.upscaling_factor, policy.downscaling_factor) == (1.0, 1.0)
    assert policy.aggregation_function == "mean"


def test_num_replicas_auto_is_1_to_100_replicas_at_2_ongoing_requests() -> None:
    auto = effective_deployment("D", {"num_replicas": "auto"}, None)
    scaling = auto.autoscaling_config
    assert scaling is not None
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (1, 100)
    assert scaling["target_ongoing_requests"] == 2.0
    assert scaling["upscale_delay_s"] == 30.0
    assert auto.num_replicas is None


def test_num_replicas_auto_keeps_the_fields_given_with_it() -> None:
    given = {"num_replicas": "auto", "autoscaling_config": {"max_replicas": 7}}
    auto = effective_deployment("D", {}, {"name": "D", **given})
    assert auto.autoscaling_config is not None
    assert (auto.autoscaling_config["min_replicas"], auto.autoscaling_config["max_replicas"]) == (
        1,
        7,
    )


def test_deprecated_smoothing_factors_stand_in_for_the_scaling_factors() -> None:
    old = AutoscalingConfig.from_mapping({"smoothing_factor": 0.5})
    assert (old.upscaling_factor, old.downscaling_factor) == (0.5, 0.5)
    split = AutoscalingConfig.from_mapping(
        {"upscale_smoothing_factor": 2, "downscale_smoothing_factor": 0.25}
    )
    assert (split.upscaling_factor, split.downscaling_factor) == (2.0, 0.25)
    new = AutoscalingConfig.from_mapping({"upscale_smoothing_factor": 2, "upscaling_factor": 3})
    assert new.upscaling_factor == 3.0


# -- the wanted count ----------------------------------------------------------------------------


def test_scales_to_load_over_target_ongoing_requests() -> None:
    assert step(config(), running=2, load=8).target == 4
    assert step(config(), running=2, load=4).target == 2
    assert step(config(target_ongoing_requests=1), running=2, load=5).target == 5
    assert step(config(), running=4, load=2).target == 1


def test_bounds_clip_the_decision() -> None:
    assert step(config(max_replicas=3), running=2, load=100).target == 3
    assert step(config(min_replicas=2), running=4, load=0).target == 2


def test_upscaling_factor_damps_the_step() -> None:
    # from 2 towards 10: 2 + 0.5 * 8 = 6
    assert step(config(upscaling_factor=0.5), running=2, load=20).target == 6


def test_downscaling_factor_damps_but_never_stalls() -> None:
    # from 10 towards 2: ceil(10 - 0.5 * 8) = 6
    assert step(config(downscaling_factor=0.5), running=10, load=4).target == 6
    # from 2 towards 1 with a tiny factor: ceil(2 - 0.01) = 2, so one replica goes anyway
    assert step(config(downscaling_factor=0.01), running=2, load=2).target == 1


# -- delays -------------------------------------------------------------------------------------


def test_upscale_waits_for_upscale_delay_s_of_continuous_demand() -> None:
    policy = config(upscale_delay_s=30)
    first = step(policy, running=1, load=10, now=0.0)
    assert first.target == 1 and first.reason == ""
    held = step(policy, running=1, load=10, now=29.0, state=first.state)
    assert held.target == 1
    done = step(policy, running=1, load=10, now=30.0, state=held.state)
    assert done.target == 5
    assert "Upscaling from 1 to 5" in done.reason


def test_a_change_of_direction_restarts_the_delay() -> None:
    policy = config(upscale_delay_s=30, downscale_delay_s=30)
    up = step(policy, running=3, load=20, now=0.0)
    down = step(policy, running=3, load=0, now=20.0, state=up.state)
    assert down.target == 3
    up_again = step(policy, running=3, load=20, now=40.0, state=down.state)
    assert up_again.target == 3  # the upscale clock started again at 40
    assert step(policy, running=3, load=20, now=70.0, state=up_again.state).target == 10


def test_steady_load_resets_the_clock() -> None:
    policy = config(upscale_delay_s=30)
    up = step(policy, running=1, load=10, now=0.0)
    steady = step(policy, running=1, load=2, now=20.0, state=up.state)
    assert steady.state == PolicyState()
    assert step(policy, running=1, load=10, now=31.0, state=steady.state).target == 1


def test_downscale_waits_for_downscale_delay_s() -> None:
    policy = config(downscale_delay_s=600)
    first = step(policy, running=4, load=0, now=0.0)
    assert first.target == 4
    assert step(policy, running=4, load=0, now=599.0, state=first.state).target == 4
    assert step(policy, running=4, load=0, now=600.0, state=first.state).target == 1


def test_only_one_to_zero_reaches_zero_after_the_to_zero_delay() -> None:
    policy = config(min_replicas=0, downscale_delay_s=10, downscale_to_zero_delay_s=100)
    # 3 -> 0 wanted: goes to 1 first
    assert step(policy, running=3, load=0, now=0.0).target == 3
    assert step(policy, running=3, load=0, now=0.0, state=PolicyState(-1, -10.0)).target == 1
    # 1 -> 0 uses downscale_to_zero_delay_s
    first = step(policy, running=1, load=0, now=0.0)
    assert step(policy, running=1, load=0, now=50.0, state=first.state).target == 1
    assert step(policy, running=1, load=0, now=100.0, state=first.state).target == 0


def test_one_to_zero_uses_downscale_delay_s_without_a_to_zero_delay() -> None:
    policy = config(min_replicas=0, downscale_delay_s=5)
    first = step(policy, running=1, load=0, now=0.0)
    assert step(policy, running=1, load=0, now=5.0, state=first.state).target == 0


def test_cold_start_from_zero_is_immediate() -> None:
    policy = config(min_replicas=0, upscale_delay_s=600)
    decision = step(policy, running=0, load=1, target=0)
    assert decision.target == 1
    assert "Upscaling from 0 to 1" in decision.reason
    assert step(config(min_replicas=0, upscaling_factor=3), running=0, load=1, target=0).target == 3


def test_zero_load_at_zero_stays_at_zero() -> None:
    assert step(config(min_replicas=0), running=0, load=0, target=0).target == 0


def test_replicas_still_starting_keep_the_target() -> None:
    assert step(config(), running=0, load=0, target=3).target == 3


# -- target_capacity ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "capacity", "expected"),
    [(10, None, 10), (10, 100, 10), (10, 50, 5), (3, 50, 2), (1, 10, 1), (5, 0, 0), (0, 50, 0)],
)
def test_capacity_rounds_half_up_and_keeps_one(
    replicas: int, capacity: float | None, expected: int
) -> None:
    assert capacity_adjusted(replicas, capacity) == expected


def test_capacity_scales_fixed_counts_and_autoscaling_bounds() -> None:
    fixed = effective_deployment("D", {"num_replicas": 4}, None)
    assert fixed.target_replicas(50) == 2
    assert fixed.target_replicas(0) == 0
    policy = config(min_replicas=2, max_replicas=10)
    assert step(policy, running=5, load=100, target_capacity=50).target == 5
    assert step(policy, running=5, load=0, target_capacity=50).target == 1


def test_scaling_up_capacity_starts_from_initial_replicas() -> None:
    policy = config(min_replicas=1, initial_replicas=4, max_replicas=10)
    assert initial_target(policy, None, None) == 4
    assert initial_target(policy, 20, "UP") == 2  # max_replicas 10 at 20% is 2
    assert step(policy, running=2, load=0, target_capacity=50, capacity_direction="UP").target == 2
    assert (
        step(policy, running=2, load=0, target_capacity=50, capacity_direction="DOWN").target == 1
    )


def test_capacity_direction() -> None:
    apps = {"a"}
    assert target_capacity_direction(None, None, apps, 50, None) == "UP"
    assert target_capacity_direction(None, None, apps, None, None) is None
    assert target_capacity_direction(apps, None, apps, 50, None) == "DOWN"
    assert target_capacity_direction(apps, 50, apps, 80, "DOWN") == "UP"
    assert target_capacity_direction(apps, 80, apps, 20, "UP") == "DOWN"
    assert target_capacity_direction(apps, 80, apps, 80, "UP") == "UP"
    assert target_capacity_direction(apps, 80, apps, None, "UP") is None
    assert target_capacity_direction(apps, 80, {"b"}, 80, "DOWN") == "UP"


# -- load aggregation --------------------------------------------------------------------------


def series(*points: tuple[float, float]) -> list[Sample]:
    return [Sample(t, v) for t, v in points]


def test_mean_is_time_weighted_over_the_summed_sources() -> None:
    r1 = series((0.0, 2.0), (5.0, 4.0))
    r2 = series((0.0, 1.0))
    # 0..5: 3, 5..10: 5 -> mean 4
    assert total_requests([r1, r2], now=10.0, look_back_period_s=30, aggregation="mean") == 4.0
    assert total_requests([r1, r2], now=10.0, look_back_period_s=30, aggregation="max") == 5.0
    assert total_requests([r1, r2], now=10.0, look_back_period_s=30, aggregation="min") == 3.0


def test_readings_older_than_the_look_back_period_do_not_count() -> None:
    old_peak = series((0.0, 100.0), (50.0, 2.0))
    assert total_requests([old_peak], now=60.0, look_back_period_s=30, aggregation="mean") == 2.0
    stale = series((0.0, 6.0))
    assert total_requests([stale], now=60.0, look_back_period_s=30, aggregation="mean") == 0.0


def test_the_window_opens_once_every_source_reported() -> None:
    replica = series((0.0, 0.0), (8.0, 0.0))
    queued = series((8.0, 4.0))
    assert (
        total_requests([replica, queued], now=10.0, look_back_period_s=30, aggregation="mean")
        == 4.0
    )


def test_no_readings_is_no_load() -> None:
    assert total_requests([], now=1.0, look_back_period_s=30, aggregation="mean") == 0.0
    assert total_requests([[]], now=1.0, look_back_period_s=30, aggregation="max") == 0.0
