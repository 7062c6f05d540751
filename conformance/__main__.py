import sys

if sys.argv[1:2] == ["report"]:  # the HTML report: python -m shardspec.conformance report R.json ... -o DIR
    from shardspec.conformance.html_report import main

    sys.exit(main(sys.argv[2:]))
from shardspec.conformance.cli import main  # noqa: E402  (the report needs no torch: import it only here)

sys.exit(main())
