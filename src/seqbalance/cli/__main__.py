"""``python -m seqbalance.cli``: the same command line as ``seqbalance``."""

import sys

from .commands import main

sys.exit(main())
