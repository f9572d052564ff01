import sys

from gptzoo.cli import main

sys.exit(main())
