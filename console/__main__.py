import sys

from console.cli import main

sys.exit(main())
