"""`python -m commdsl.calibrate` / `torchrun -m commdsl.calibrate`."""

import sys

from commdsl.calibrate.main import main
from commdsl.run.launch import die_with_launcher

die_with_launcher()
sys.exit(main())
