"""``python3 soak-launcher.py ...`` (the built zipapp runs this) and ``python3 -m sidecar.launcher``."""

import sys

from .main import main

sys.exit(main())
