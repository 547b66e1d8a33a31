"""``python -m choreo_operator``."""

import sys

from choreo_operator.cli import main

sys.exit(main())
