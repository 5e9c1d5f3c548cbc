"""``python -m tether.demo``: run the demo."""

import sys

from .app import main

sys.exit(main())
