"""A stand-in for the worker in tests of shardspec.conformance.harness.spawn.

``main([folder, failing_rank])`` writes the rank's environment to
``folder/rank<R>.json``; the rank named ``failing_rank`` exits with status 3,
the others wait a little (a failing peer must stop them).
"""

import json
import os
import pathlib
import time

PRELOADED = []


def preload(args):
    PRELOADED.append(os.getpid())


def main(args):
    folder, failing_rank = pathlib.Path(args[0]), int(args[1])
    rank = int(os.environ["RANK"])
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    info = {key: os.environ[key] for key in keys}
    info["preloaded_by"] = PRELOADED
    (folder / f"rank{rank}.json").write_text(json.dumps(info))
    if rank == failing_rank:
        return 3
    if failing_rank >= 0:
        time.sleep(30)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
