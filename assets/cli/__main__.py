"""``python -m assets.cli`` is the ``strata`` command."""

import sys

from assets.cli import main

sys.exit(main())
