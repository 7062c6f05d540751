import sys

from shardspec.conformance.cli import main

sys.exit(main())
