"""Make the kubeserve package importable from a source checkout."""

import sys
from pathlib import Path

OPERATOR = str(Path(__file__).resolve().parents[3] / "operator")
if OPERATOR not in sys.path:
    sys.path.insert(0, OPERATOR)
