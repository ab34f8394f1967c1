"""``python -m vkserve``: the same as the ``vkserve`` console script."""

import sys

from vkserve.cli.main import main

sys.exit(main())
