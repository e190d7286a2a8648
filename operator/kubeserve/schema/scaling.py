"""The external scaling API's bodies (Ray 2.60's ``ScaleDeploymentRequest``).

``POST /api/v1/applications/{application}/deployments/{deployment}/scale`` sets a deployment's
replica count from outside, for applications deployed with ``external_scaler_enabled: true``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, NonNegativeInt

from kubeserve.schema.config import RestModel
from kubeserve.schema.limits import MAX_REPLICAS_PER_DEPLOYMENT

#: Ray's answer to an accepted scaling request.
SCALE_ACCEPTED = "Scaling request received. Deployment will get scaled asynchronously."


class ScaleDeploymentRequest(RestModel):
    """The replica count to run."""

    target_num_replicas: Annotated[NonNegativeInt, Field(le=MAX_REPLICAS_PER_DEPLOYMENT)]


class ScaleDeploymentResponse(BaseModel):
    message: str = SCALE_ACCEPTED
