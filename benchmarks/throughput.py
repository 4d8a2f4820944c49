"""Offline throughput benchmark (same as ``octavo bench throughput``); see ``octavo.cli.bench_throughput``."""

import sys

from octavo.cli.bench_throughput import main

if __name__ == "__main__":
    sys.exit(main())
