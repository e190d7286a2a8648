"""Replica placement: claims, fitting, pacing, and the message of replicas that do not fit."""

import pytest

from kubeserve.control.effective_config import EffectiveDeployment, effective_deployment
from kubeserve.control.placement import (
    Node,
    Placement,
    accelerator_type,
    admit,
    assign_gpus,
    custom_resources,
    fits,
    gpu_devices,
    low_memory_message,
    memory_reserve,
    node_room,
    per_node_cap_message,
    place,
    replica_claim,
    unschedulable_message,
)


def test_a_replica_claims_one_cpu_by_default_as_in_ray_serve() -> None:
    assert replica_claim(effective_deployment("D", {}, None)) == {"CPU": 1.0, "GPU": 0.0}


def test_a_replica_claims_what_its_actor_options_say() -> None:
    config = effective_deployment(
        "D", {"ray_actor_options": {"num_cpus": 0.5}}, {"ray_actor_options": {"num_gpus": 1}}
    )
    assert replica_claim(config) == {"CPU": 1.0, "GPU": 1.0}  # the override replaces the whole
    config = effective_deployment("D", {"ray_actor_options": {"num_cpus": 0}}, None)
    assert replica_claim(config) == {"CPU": 0.0, "GPU": 0.0}


def test_memory_and_an_accelerator_type_are_claimed_as_ray_encodes_them() -> None:
    options = {"memory": 2.5e9, "accelerator_type": "A100", "resources": {"slot": 1}}
    config = effective_deployment("D", {"ray_actor_options": options}, None)
    assert replica_claim(config) == {
        "CPU": 1.0,
        "GPU": 0.0,
        "memory": 2_500_000_000.0,
        "slot": 1.0,
        "accelerator_type:A100": 0.001,
    }
    node = {"CPU": 16.0, "GPU": 1.0, "memory": 4e9, "slot": 1.0}
    assert not fits(replica_claim(config), node)  # a node without the type
    assert fits(replica_claim(config), {**node, "accelerator_type:A100": 1.0})
    assert not fits(replica_claim(config), {**node, "accelerator_type:A100": 1.0, "memory": 2e9})
    # a thousand replicas of one type share the node's one unit, as in Ray
    assert admit(1000, {"accelerator_type:A100": 0.001}, {"accelerator_type:A100": 1.0}, 2000) == (
        1000,
        0,
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA RTX PRO 6000 Blackwell", "RTX-PRO-6000"),
        ("NVIDIA GeForce RTX 5090", "GeForce-RTX-5090"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_a_gpu_name_gives_the_accelerator_type_ray_would(name: str, kind: str) -> None:
    assert accelerator_type(name) == kind


def test_fits_checks_cpus_and_gpus() -> None:
    assert fits({"CPU": 1, "GPU": 0}, {"CPU": 1, "GPU": 0})
    assert not fits({"CPU": 1, "GPU": 1}, {"CPU": 4, "GPU": 0})
    assert fits({"CPU": 0.1, "GPU": 0}, {"CPU": 0.30000000000000004 - 0.2, "GPU": 0})


def test_admit_starts_what_fits_and_counts_the_rest() -> None:
    assert admit(5, {"CPU": 1, "GPU": 0}, {"CPU": 3, "GPU": 0}, 8) == (3, 2)
    assert admit(1_000_000, {"CPU": 1, "GPU": 0}, {"CPU": 16, "GPU": 0}, 8) == (8, 999_984)
    assert admit(3, {"CPU": 0.5, "GPU": 0}, {"CPU": 1, "GPU": 0}, 8) == (2, 1)
    assert admit(2, {"CPU": 1, "GPU": 1}, {"CPU": 8, "GPU": 0}, 8) == (0, 2)


def test_pacing_holds_back_without_calling_it_unschedulable() -> None:
    assert admit(10, {"CPU": 0, "GPU": 0}, {"CPU": 0, "GPU": 0}, 4) == (4, 0)
    assert admit(10, {"CPU": 1, "GPU": 0}, {"CPU": 100, "GPU": 0}, 0) == (0, 0)
    assert admit(0, {"CPU": 1, "GPU": 0}, {"CPU": 0, "GPU": 0}, 4) == (0, 0)


def test_the_message_says_what_is_needed_what_is_left_and_what_to_do() -> None:
    message = unschedulable_message(
        "app", "Model", 3, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 0.0}, {"CPU": 16, "GPU": 0}
    )
    assert message.startswith("Deployment 'Model' in application 'app' has 3 replicas that")
    assert 'resources required for each replica: {"CPU": 1.0, "GPU": 1.0}' in message
    assert 'total resources available: {"CPU": 2.0, "GPU": 0.0}' in message
    assert "--num-gpus" in message


def test_memory_kept_free_is_a_floor_or_a_share_of_the_machine() -> None:
    assert memory_reserve(1 << 30) == 256 << 20
    assert memory_reserve(64 << 30) == int((64 << 30) * 0.05)
    message = low_memory_message("app", "Model", 4, 100 << 20, 4 << 30)
    assert "has 4 replicas waiting to start" in message
    assert "100 MiB of memory available" in message and "256 MiB free" in message


def test_gpu_devices_are_the_visible_ones_then_numbers_after_them() -> None:
    assert gpu_devices(2, ["4", "7", "9"]) == ["4", "7"]
    assert gpu_devices(3, ["1"]) == ["1", "2", "3"]
    assert gpu_devices(2, []) == ["0", "1"]
    assert gpu_devices(0, ["0"]) == []


def test_whole_gpus_take_free_devices_in_order() -> None:
    free = {"0": 0.5, "1": 1.0, "2": 1.0}
    assert assign_gpus(1, free) == ["1"]
    assert assign_gpus(2, free) == ["1", "2"]
    assert assign_gpus(3, free) is None  # 2.5 free in sum, but not 3 whole devices
    assert assign_gpus(0, free) == []


def test_a_fraction_shares_the_device_it_fits_most_tightly() -> None:
    free = {"0": 1.0, "1": 0.5, "2": 0.25}
    assert assign_gpus(0.5, free) == ["1"]  # packs with the other half, keeps 0 whole
    assert assign_gpus(0.25, free) == ["2"]
    assert assign_gpus(0.75, free) == ["0"]
    assert assign_gpus(0.5, {"0": 0.25, "1": 0.25}) is None


def test_max_replicas_per_node_caps_what_the_one_node_holds() -> None:
    free = {"CPU": 16, "GPU": 0}
    assert admit(3, {"CPU": 1, "GPU": 0}, free, 8, node_room(2, 0)) == (2, 1)
    assert admit(3, {"CPU": 1, "GPU": 0}, free, 8, node_room(2, 2)) == (0, 3)
    assert admit(3, {"CPU": 1, "GPU": 0}, free, 8, node_room(2, 5)) == (0, 3)  # never negative
    assert admit(3, {"CPU": 1, "GPU": 0}, free, 8, node_room(None, 5)) == (3, 0)
    assert admit(3, {"CPU": 1, "GPU": 0}, {"CPU": 1, "GPU": 0}, 8, node_room(2, 0)) == (1, 2)
    message = per_node_cap_message("app", "Model", 1, 2)
    assert message.startswith("Deployment 'Model' in application 'app' has 1 replica that")
    assert "max_replicas_per_node is 2" in message and "lower num_replicas to 2" in message


def test_custom_resources_are_claimed_and_must_fit_as_in_ray() -> None:
    config = effective_deployment("D", {"ray_actor_options": {"resources": {"tpu_slot": 2}}}, None)
    claim = replica_claim(config)
    assert claim == {"CPU": 1.0, "GPU": 0.0, "tpu_slot": 2.0}
    assert admit(3, claim, {"CPU": 16, "GPU": 0, "tpu_slot": 5}, 8) == (2, 1)
    assert admit(3, claim, {"CPU": 16, "GPU": 0}, 8) == (0, 3)  # the node has none of it
    message = unschedulable_message("app", "D", 3, claim, {"CPU": 16, "GPU": 0}, {"CPU": 16})
    assert '"tpu_slot": 2.0' in message and "--resources" in message


def test_resources_flag_as_ray_start_takes_it() -> None:
    assert custom_resources("") == {}
    assert custom_resources('{"tpu_slot": 4, "accelerator_type:A100": 1}') == {
        "tpu_slot": 4.0,
        "accelerator_type:A100": 1.0,
    }
    for bad, reason in [
        ("{", "not JSON"),
        ("[1]", "a JSON object"),
        ('{"CPU": 2}', "give CPU with --num-cpus"),
        ('{"memory": 2}', "give memory with --memory"),
        ('{"object_store_memory": 2}', "there is no object store"),
        ('{"x": -1}', "not a non-negative number"),
        ('{"x": "1"}', "not a non-negative number"),
    ]:
        with pytest.raises(ValueError, match=reason):
            custom_resources(bad)


def _node(**overrides: object) -> Node:
    values: dict[str, object] = {
        "free": {"CPU": 4.0, "GPU": 0.0, "memory": 8e9},
        "total": {"CPU": 4.0, "GPU": 0.0, "memory": 8e9},
        "gpu_free": {},
        "labels": {},
        "start_slots": 8,
    }
    return Node(**{**values, **overrides})  # type: ignore[arg-type]


def _config(**fields: object) -> EffectiveDeployment:
    return effective_deployment("D", dict(fields), None)


def test_place_starts_what_fits_and_says_what_is_left_after_those() -> None:
    decision = place("app", "D", _config(), 6, _node(), 0, old_serving=False)
    assert (decision.start, decision.waiting, decision.make_room) == (4, 2, False)
    assert "has 2 replicas that cannot be scheduled" in decision.reason
    assert 'total resources available: {"CPU": 0.0}' in decision.reason
    assert place("app", "D", _config(), 3, _node(), 0, old_serving=False) == Placement(3)


def test_place_counts_gpu_devices_not_only_their_sum() -> None:
    node = _node(
        free={"CPU": 4.0, "GPU": 1.0},
        total={"CPU": 4.0, "GPU": 2.0},
        gpu_free={"0": 0.5, "1": 0.5},
    )
    options = {"num_gpus": 1}
    decision = place("app", "D", _config(ray_actor_options=options), 1, node, 0, False)
    assert (decision.start, decision.waiting) == (0, 1)
    halves = place("app", "D", _config(ray_actor_options={"num_gpus": 0.5}), 3, node, 0, False)
    assert (halves.start, halves.waiting) == (2, 1)


def test_place_waits_for_the_labels_the_memory_and_the_cap_in_that_order() -> None:
    selector = {"ray_actor_options": {"label_selector": {"zone": "a"}}}
    decision = place("app", "D", _config(**selector), 2, _node(labels={"zone": "b"}), 0, True)
    assert decision == Placement(0, 2, decision.reason) and "label_selector" in decision.reason
    low = place("app", "D", _config(), 2, _node(low_memory=(1 << 20, 1 << 30)), 0, True)
    assert (low.start, low.make_room) == (0, False) and "waiting to start" in low.reason
    capped = place("app", "D", _config(max_replicas_per_node=2), 3, _node(), 1, False)
    assert (capped.start, capped.waiting) == (
        1,
        2,
    ) and "max_replicas_per_node is 2" in capped.reason


def test_place_makes_room_only_for_a_version_the_node_could_hold() -> None:
    full = _node(free={"CPU": 0.0, "GPU": 0.0}, total={"CPU": 2.0, "GPU": 0.0})
    assert place("app", "D", _config(), 1, full, 2, old_serving=True).make_room
    assert not place("app", "D", _config(), 1, full, 2, old_serving=False).make_room
    never = _config(ray_actor_options={"num_cpus": 3})
    assert not place("app", "D", never, 1, full, 2, old_serving=True).make_room
