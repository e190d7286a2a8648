"""Overrides naming deployments the application does not have (Ray: DEPLOY_FAILED)."""

from kubeserve.control.effective_config import unknown_override_error


def test_overrides_of_existing_deployments_are_fine() -> None:
    assert unknown_override_error([{"name": "Greeter"}], ["Frontend", "Greeter"]) is None
    assert unknown_override_error([], ["Frontend"]) is None


def test_an_unknown_name_is_named_with_what_exists_in_rays_words() -> None:
    message = unknown_override_error([{"name": "Gretter"}], ["Frontend", "Greeter"])
    assert message == "Deployment 'Gretter' does not exist. Available: ['Frontend', 'Greeter']"


def test_every_unknown_name_is_named() -> None:
    message = unknown_override_error(
        [{"name": "A"}, {"name": "Greeter"}, {"name": "B"}], ["Frontend", "Greeter"]
    )
    assert message == "Deployments 'A', 'B' do not exist. Available: ['Frontend', 'Greeter']"
