"""``python -m lockgate.cli``: the ``lockgate`` command."""

import sys

from lockgate.cli import main

sys.exit(main())
