"""``python -m tailgate.slo``: the same as ``tailgate slo``."""

import os
import sys

from tailgate.slo.command import main

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
