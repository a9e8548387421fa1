"""``python -m tailgate.verify.groundtruth``."""

import sys

from .cli import main

sys.exit(main())
