"""Test application whose import never finishes: its build hangs (until it is killed).

The build process writes its PID to the file named by ``KS_PID_FILE`` first, so a test can check
that a build nobody wants any more is killed.
"""

import os
import time
from pathlib import Path

Path(os.environ["KS_PID_FILE"]).write_text(str(os.getpid()))
time.sleep(600)
