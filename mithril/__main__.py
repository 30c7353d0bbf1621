"""``python -m mithril``: the ``mithril`` command line (:mod:`mithril.cli`)."""

import sys

from .cli import main

sys.exit(main())
