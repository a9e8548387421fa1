"""``python -m postprocess RESULTS_DIR``: the report without the ``tailgate`` console script."""

import sys

from tailgate.postprocess.cli import main

sys.exit(main())
