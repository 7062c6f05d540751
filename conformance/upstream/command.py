"""``python -m shardspec.conformance upstream PATH``: does vLLM's batch_shard.py still match the spec?

PATH: a vLLM source tree, a vLLM wheel (read from the zip), one batch_shard.py, or ``installed`` (found
with importlib.util.find_spec). The file is read by AST, never imported. Types come from the code:
annotations (``input_batch: InputBatch``, ``local_output: SamplerOutput | None``), constructors,
``replace(x, ...)``, and fields whose spec entry is a record (``lp = local_output.logprobs_tensors``).
A field is touched when read (``x.f``, ``getattr(x, "f")``; ``x.f(...)`` is a method), given by keyword
to a constructor or to ``replace``/``_replace``, or declared in a class body (BatchShardMetadata).
Findings: touched fields in no profile of the spec, and spec fields the code no longer touches.
Exit 0 clean, 1 findings, 2 bad input (one line on stderr). With --behaviour the code is run instead of
read: which bundled profile's rules it follows, rule by rule (behaviour.py, verdicts.py)."""

from __future__ import annotations

import argparse
import json
import sys

from shardspec.conformance.upstream.drift import check, render, touched_fields
from shardspec.conformance.upstream.source import UpstreamInputError, read_source
from shardspec.spec.errors import SpecFileError
from shardspec.spec.loader import UnknownProfileError

PROG = "python -m shardspec.conformance upstream"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[1])
    parser.add_argument("path", metavar="PATH", help="a vLLM source tree, a vLLM wheel, a batch_shard.py, or installed")
    parser.add_argument("--profile", help="compare against this profile's fields (default: every profile's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--behaviour",
        action="store_true",
        help="run the sharder (installed, or a tree's or one batch_shard.py through the stand-ins) on a few "
        "generated cases under each bundled profile and say which profile's rules it follows "
        "(conformance/upstream/behaviour.py, verdicts.py)",
    )
    parser.add_argument(
        "--hide-profile",
        action="append",
        default=[],
        metavar="NAME",
        help="with --behaviour: leave this bundled profile out, as if it did not exist (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.hide_profile and not args.behaviour:
        parser.error("--hide-profile needs --behaviour")
    try:
        if args.behaviour:
            return _behaviour(args)
        report = check(args.path, args.profile)
    except (UpstreamInputError, UnknownProfileError, SpecFileError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return report["exit_code"]


def _behaviour(args) -> int:
    # The run needs the suite's harness and torch; the drift check, only the spec and the file
    from shardspec.conformance.upstream import behaviour, verdicts

    if args.profile:
        raise UpstreamInputError("--behaviour runs every bundled profile; leave some out with --hide-profile")
    if args.path.endswith(".whl"):
        raise UpstreamInputError(
            f"{args.path}: --behaviour runs installed, a source tree or a batch_shard.py, not a wheel"
        )
    try:
        behaviour.visible_profiles(tuple(args.hide_profile))  # a bad name before anything is read
        source = read_source(args.path)
        target = "installed" if args.path == "installed" else source.label  # the batch_shard.py of a tree
        report = behaviour.check(target, touched_fields(source), tuple(args.hide_profile))
    except behaviour.BehaviourInputError as exc:
        raise UpstreamInputError(str(exc)) from None
    print(json.dumps(report, indent=2, default=str) if args.json else verdicts.render(report))
    return report["exit_code"]
