"""`python -m commdsl.calibrate` / `torchrun -m commdsl.calibrate`."""

import sys

from commdsl.calibrate.main import main

sys.exit(main())
