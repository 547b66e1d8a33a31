"""``python -m choreo_dev`` runs the ``choreo-dev`` command."""

import sys

from choreo_dev.cli import main

sys.exit(main())
