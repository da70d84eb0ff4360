import sys

from ge2.cli import main

sys.exit(main())
