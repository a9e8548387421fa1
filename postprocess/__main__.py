"""``python -m postprocess RESULTS_DIR``: the report without the ``tailgate`` console script."""

import sys

from .cli import main

sys.exit(main())
