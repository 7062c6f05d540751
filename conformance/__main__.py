import sys

import shardspec

if getattr(shardspec, "__file__", None) is None:  # a folder named shardspec (a clone?) shadows the package
    folders = ", ".join(getattr(shardspec, "__path__", []))
    print(
        f"python -m shardspec.conformance: error: the folder {folders} shadows the installed shardspec package; "
        "run from another folder (or install that clone: pip install -e it)",
        file=sys.stderr,
    )
    sys.exit(2)
if sys.argv[1:2] == ["report"]:  # the HTML report: python -m shardspec.conformance report R.json ... -o DIR
    from shardspec.conformance.report.html import main

    sys.exit(main(sys.argv[2:]))
if sys.argv[1:2] == ["upstream"]:  # the drift check of a vLLM tree, wheel or batch_shard.py (needs no torch)
    from shardspec.conformance.upstream.command import main

    sys.exit(main(sys.argv[2:]))
from shardspec.conformance.cli import main  # noqa: E402  (the report needs no torch: import it only here)

sys.exit(main())
