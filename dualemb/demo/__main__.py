"""``python -m dualemb.demo``."""

import sys

from dualemb.demo.cli import main

sys.exit(main())
