"""What a case named on the command line may be: inside its folder, of a sane size, with a known error ID.

A case file is data from anywhere: before any tensor is built, its sizes are
bounded (a case is a test, not a load test) and its ``expect_error`` must
name a precondition of the spec.
"""

from __future__ import annotations

import pathlib
import re
import stat

from shardspec.conformance.usage import MAX_TP, UsageError
from shardspec.spec.loader import load_spec

MAX_FILE_BYTES = 1 << 20
MAX_REQS = 1 << 16  # requests in a batch, and the sharder's capacity
MAX_VOCAB = 1 << 20
MAX_LOGITS_ELEMENTS = 1 << 26  # logits rows x vocab: 256 MiB in float32
CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~-]*$")


def checked_case_id(case_id: str) -> str:
    """A fixture id names a file of the fixtures folder, never a path."""
    if not CASE_ID.match(case_id):
        raise UsageError(f"--case {case_id!r}: not a fixture id (letters, digits, '.', '_', '-', no path)")
    return case_id


def checked_case_file(path: str) -> str:
    file = pathlib.Path(path)
    try:
        mode = file.stat().st_mode  # a link to a case file is read: it is only read
    except FileNotFoundError:
        raise UsageError(f"--case-file {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"--case-file {path}: cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"--case-file {path}: is a folder, not a case file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None
        raise UsageError(f"--case-file {path}: is {kind + ', ' if kind else ''}not a regular file")
    if file.stat().st_size > MAX_FILE_BYTES:
        raise UsageError(
            f"--case-file {path}: {file.stat().st_size} bytes, more than a case may have ({MAX_FILE_BYTES})"
        )
    return path


def checked_case(case, where: str):
    """``case`` unchanged, or a UsageError naming the field that is out of bounds (of any of its steps)."""
    problems = _problems(case)
    for number, step in enumerate(getattr(case, "then", None) or [], 1):
        problems += [f"step {number}: {problem}" for problem in _problems(step)]
    if problems:
        raise UsageError(f"{where}: {'; '.join(problems)}")
    return case


def _problems(case) -> list[str]:
    problems = []
    if not 1 <= case.tp_size <= MAX_TP:
        problems.append(f"tp_size {case.tp_size} is not in 1..{MAX_TP}")
    if not 1 <= case.max_num_reqs <= MAX_REQS:
        problems.append(f"max_num_reqs {case.max_num_reqs} is not in 1..{MAX_REQS}")
    if len(case.slots) > MAX_REQS:
        problems.append(f"{len(case.slots)} requests, more than {MAX_REQS}")
    if not 1 <= case.vocab_size <= MAX_VOCAB:
        problems.append(f"vocab_size {case.vocab_size} is not in 1..{MAX_VOCAB}")
    rows = sum(max(int(n), 0) for n in case.num_logits_per_req)
    if rows * case.vocab_size > MAX_LOGITS_ELEMENTS:
        problems.append(f"{rows} logits rows x vocab {case.vocab_size} is more than {MAX_LOGITS_ELEMENTS} values")
    # The suite builds a logits row for every scheduled token (the model's output before the rows are picked).
    tokens = sum(max(int(q), 0) for q in case.query_lens or ())
    if tokens * case.vocab_size > MAX_LOGITS_ELEMENTS:
        problems.append(
            f"query_lens: {tokens} tokens x vocab {case.vocab_size} is more than {MAX_LOGITS_ELEMENTS} values"
        )
    dims = case.logprobs_dims
    if dims is not None and all(isinstance(d, int) for d in dims) and dims:
        columns = 1 + max(max(dims), 0)  # the agreed width (spec/model.py, num_logprob_columns)
        if rows * columns > MAX_LOGITS_ELEMENTS or max(dims) > MAX_VOCAB:
            problems.append(
                f"logprobs_dims {tuple(dims)}: {rows} logits rows x {columns} logprob columns is more than "
                f"{MAX_LOGITS_ELEMENTS} values"
            )
    if case.expect_error is not None and case.expect_error not in precondition_ids():
        problems.append(f"expect_error {case.expect_error!r} is not a precondition ID of the spec")
    return problems


def precondition_ids() -> set[str]:
    return {pre.id for pre in load_spec().preconditions}
