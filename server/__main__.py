"""`python -m tinyhal.server` is `tinyhal-serve`."""

import sys

from .main import main

sys.exit(main())
