import sys

from bench.results_index.cli import main

if __name__ == "__main__":
    sys.exit(main())
