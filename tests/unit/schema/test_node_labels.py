"""Node labels and Ray 2.60's label selectors: parsing, matching, ``--labels``."""

from __future__ import annotations

import pytest

from kubeserve.schema.config import RayActorOptionsSchema
from kubeserve.schema.node_labels import LabelCondition, matches, parse_labels, parse_selector


def test_the_four_conditions_of_ray_parse() -> None:
    selector = {"zone": "a", "pool": "!b", "gpu": "in(h100, a100)", "tier": "!in(spot,x)"}
    assert parse_selector(selector) == [
        LabelCondition("gpu", "In", ("h100", "a100")),
        LabelCondition("pool", "NotIn", ("b",)),
        LabelCondition("tier", "NotIn", ("spot", "x")),
        LabelCondition("zone", "In", ("a",), plain=True),
    ]
    assert parse_selector(None) == parse_selector({}) == []


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"zone": "a"}, {"zone": "a"}, True),
        ({"zone": "a"}, {"zone": "b"}, False),
        ({"zone": "a"}, {}, False),
        ({"zone": "!a"}, {}, True),  # a node without the label passes a ! condition
        ({"zone": "!a"}, {"zone": "a"}, False),
        ({"zone": "in(a, b)"}, {"zone": "b"}, True),
        ({"zone": "in(a, b)"}, {"zone": "c"}, False),
        ({"zone": "!in(a, b)"}, {"zone": "c"}, True),
        ({"zone": "a", "pool": "x"}, {"zone": "a", "pool": "y"}, False),
    ],
)
def test_a_node_matches_when_every_condition_holds(
    selector: dict[str, str], labels: dict[str, str], expected: bool
) -> None:
    assert matches(parse_selector(selector), labels) is expected


@pytest.mark.parametrize("value", ["in(a", "a)", "in()", "!!a", "a b", "in(a,,b)", "x" * 64])
def test_what_is_not_a_condition_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ValueError, match=r"^'zone': .* is not a node label condition"):
        parse_selector({"zone": value})
    with pytest.raises(ValueError, match="label_selector"):
        RayActorOptionsSchema.model_validate({"label_selector": {"zone": value}})


def test_labels_as_ray_start_takes_them() -> None:
    assert parse_labels("") == {}
    assert parse_labels('"zone=a, pool = b"') == {"zone": "a", "pool": "b"}
    assert parse_labels("example.com/tier=gold,") == {"example.com/tier": "gold"}
    for bad, reason in [
        ("zone", "not a key=value pair"),
        ("a=b=c", "not a key=value pair"),
        ("-x=1", "not a label key"),
        ("zone=a b", "not a label value"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_labels(bad)


def test_cpus_and_gpus_in_resources_are_refused_in_rays_words() -> None:
    with pytest.raises(ValueError, match="Use the 'num_cpus' and 'num_gpus' keyword instead"):
        RayActorOptionsSchema.model_validate({"resources": {"CPU": 2}})
    assert RayActorOptionsSchema.model_validate({"resources": {"tpu": 2}}).resources == {"tpu": 2.0}


@pytest.mark.parametrize("key", ["memory", "object_store_memory"])
def test_memory_in_resources_is_refused_in_rays_words(key: str) -> None:
    with pytest.raises(ValueError, match="must not contain the key 'memory' or 'object_store"):
        RayActorOptionsSchema.model_validate({"resources": {key: 2}})
