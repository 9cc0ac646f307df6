"""``python -m toolnexus.cli``: the ``toolnexus`` command."""

import sys

from . import main

sys.exit(main())
