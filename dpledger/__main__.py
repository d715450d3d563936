import sys

from dpledger.cli import main

sys.exit(main())
