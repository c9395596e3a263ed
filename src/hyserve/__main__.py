import sys

from hyserve.cli import main

sys.exit(main())
