import sys

from metrale.cli import main

sys.exit(main())
