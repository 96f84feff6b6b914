import sys

from archive.cli import main

sys.exit(main())
