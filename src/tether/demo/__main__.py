"""``python -m tether.demo``: run the demo."""

import sys

from .walkthrough import main

sys.exit(main())
