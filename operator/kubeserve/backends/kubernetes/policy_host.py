"""Where the operator asks an application's custom autoscaling policies: its policy host pod.

A policy is user code; the operator never imports it. An application with a custom policy (a
deployment's ``autoscaling_config.policy`` in code or config, or the application's
``autoscaling_policy``) gets one pod of its own (:func:`~.render.render_policy_workload`)
running ``kubeserve policy-host`` in the application's image and environment; the operator
posts each decision's request to it over the data plane's authenticated channel (the instance's
secret, the pod's name as the identity it must prove) and gets the policy's answer back
(:mod:`kubeserve.runtime.policy_server`). No pod, an unready one, a refused handshake or a
timeout are :class:`~kubeserve.control.autoscaling_state.PolicyFailure`: the counts stay as they
are and the deployment's status says why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeserve.backends.kubernetes.pods import serving_pods
from kubeserve.control.autoscaling_state import PolicyFailure
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.policy_server import FIRST_CALL_TIMEOUT_S
from kubeserve.schema.config import is_default_policy

__all__ = ["PolicyHost", "find_policy_host", "needs_policy_host"]

log = logging.getLogger(__name__)

#: The host answers within its own deadline (and restarts past it); this covers the trip.
_CALL_TIMEOUT_S = FIRST_CALL_TIMEOUT_S + 5.0


def needs_policy_host(
    app_config: Mapping[str, Any], configs: Mapping[str, EffectiveDeployment]
) -> bool:
    """Whether the application asks for a custom policy anywhere: its ``autoscaling_policy``, or
    the effective ``autoscaling_config.policy`` of one of its deployments (code or config)."""
    if not is_default_policy(app_config.get("autoscaling_policy")):
        return True
    return any(
        not is_default_policy((config.autoscaling_config or {}).get("policy"))
        for config in configs.values()
    )


@dataclass(frozen=True)
class PolicyHost:
    """The application's policy host pod as the operator reaches it (``ip`` empty: no pod is
    ready, and asking fails saying so)."""

    workload: str
    secret: bytes
    ip: str = ""
    pod_name: str = ""

    async def answer(self, request: dict[str, Any]) -> object:
        """The policy host's answer to ``request`` (see
        :func:`~kubeserve.control.autoscaling_state.ask_policy`)."""
        if not self.ip:
            where = f" (Deployment {self.workload})" if self.workload else ""
            raise PolicyFailure(f"the application's policy host{where} has no ready pod")
        try:
            status, body = await channel.request(
                self.ip,
                contract.POLICY_PORT,
                "POST",
                wire.AUTOSCALING_POLICY_PATH,
                self.secret,
                self.pod_name,
                json.dumps(request).encode(),
                timeout_s=_CALL_TIMEOUT_S,
            )
        except TimeoutError:
            raise PolicyFailure(
                f"the policy host pod {self.pod_name} did not answer within {_CALL_TIMEOUT_S:.0f} s"
            ) from None
        except OSError as exc:  # ChannelError and ConnectionError included
            raise PolicyFailure(f"the policy host pod {self.pod_name}: {exc}") from None
        text = body.decode("utf-8", "replace")
        if status != 200:
            raise PolicyFailure(f"the policy host pod {self.pod_name} answered {status}: {text}")
        try:
            return json.loads(text)
        except ValueError:
            raise PolicyFailure(
                f"the policy host pod {self.pod_name} answered {text[:200]!r}"
            ) from None


def find_policy_host(workload: str, pods: list[dict[str, Any]], secret: bytes) -> PolicyHost:
    """The ready pod among the policy host's ``pods`` (the newest, should a rollout overlap)."""
    ready = serving_pods(pods)
    if not ready:
        return PolicyHost(workload, secret)
    newest = max(ready, key=lambda pod: str(pod["metadata"].get("creationTimestamp", "")))
    return PolicyHost(workload, secret, str(newest["status"]["podIP"]), newest["metadata"]["name"])
