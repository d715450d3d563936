import sys

from dpledger.cli import main

if __name__ == "__main__":  # Dask's worker processes re-import this module (spawn): it must not run the CLI then
    sys.exit(main())
