"""``python -m choreo_agents``: the node agent."""

import sys

from choreo_agents.cli import main

sys.exit(main())
