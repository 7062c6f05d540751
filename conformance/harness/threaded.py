"""Every rank a thread of this process, in a torch.distributed group of torch's threaded backend.

Unlike the lockstep group, each rank gets a :class:`shardspec.comm.TorchDistComm`
whose ``.group`` is a real ``torch.distributed`` ProcessGroup, as in a
multi-process run: implementations that call ``torch.distributed`` themselves
run in-process too, e.g. at tp 8 on one GPU with compiled kernels, where NCCL
would need eight GPUs.

One rank runs at a time: a rank holds the turn except while it waits inside a
collective, so code that is not thread-safe (the Triton interpreter) runs
here as well. The backend waits without a time limit, so this module watches
it: once every rank has either finished or is waiting in a collective that a
finished rank will never join, the waiting ranks are woken with an error; a
rank that does not finish within ``timeout_s`` is reported instead of waited
for. Uses torch's private ``torch.testing._internal.distributed.multi_threaded_pg``
(present in torch 2.11 and 2.13; its interface is not promised).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from shardspec.comm import TorchDistComm

BACKEND = "threaded"
GRACE_S = 5.0  # after a timeout, how long woken ranks get to record their errors and finish


def _threaded_pg():
    try:
        from torch.testing._internal.distributed import multi_threaded_pg  # private; some torch builds lack it
    except ImportError as exc:  # pragma: no cover - depends on the torch build
        raise RuntimeError(
            "the torch-threads group needs torch.testing._internal.distributed."
            f"multi_threaded_pg, which this torch ({torch.__version__}) lacks: {exc}"
        ) from exc
    return multi_threaded_pg


class _Turns:
    """Who may run, who waits in a collective, who has finished; wakes waiters that can never complete."""

    def __init__(self, world_size: int, terminate: Callable[[BaseException], None]):
        self.world_size = world_size
        self._turn = threading.Lock()
        self._holding = threading.local()
        self._state = threading.Lock()
        self._terminate = terminate
        self.waiting: dict[int, object] = {}  # rank -> the backend's Collective it waits in
        self.finished: set[int] = set()
        self.abandoned: str | None = None  # why waiting ranks were woken

    def take(self) -> None:
        """Wait for the turn; once the run has ended, go on without it (a hung rank may keep it)."""
        while not self._turn.acquire(timeout=0.05):
            if self.abandoned is not None:
                return
        self._holding.turn = True

    def give(self) -> None:
        if getattr(self._holding, "turn", False):
            self._holding.turn = False
            self._turn.release()

    def wait_in(self, rank: int, collective) -> None:
        with self._state:
            self.waiting[rank] = collective
            self._wake_if_stuck()
        self.give()

    def resume(self, rank: int) -> None:
        with self._state:  # out of the collective, though perhaps not running yet
            self.waiting.pop(rank, None)
        self.take()

    def finish(self, rank: int) -> None:
        with self._state:
            self.finished.add(rank)
            self._wake_if_stuck()

    def end(self, why: str) -> None:
        with self._state:
            self._end(why)

    def _wake_if_stuck(self) -> None:
        # A collective that completed (its ranks not yet returned from it) is not waited in any more.
        stuck = {rank: collective for rank, collective in self.waiting.items() if not collective._done}
        if self.finished and stuck and len(self.finished) + len(stuck) == self.world_size:
            waiting = ", ".join(f"rank {r} in {type(c._collective).__name__}" for r, c in sorted(stuck.items()))
            self._end(
                f"rank(s) {sorted(self.finished)} finished without joining the collective(s) that {waiting} waited in"
            )

    def _end(self, why: str) -> None:
        if self.abandoned is None:
            self.abandoned = why
            self._terminate(RuntimeError(why))


@contextlib.contextmanager
def _threaded_world(world_size: int):
    """torch's threaded world installed, its collectives taking turns (yields the turns); restored after."""
    pg = _threaded_pg()
    original_join = pg.Collective.join
    turns = _Turns(world_size, pg.ProcessLocalGroup.exception_handle)

    def join(collective, rank, data):
        turns.wait_in(rank, collective)
        try:
            return original_join(collective, rank, data)
        except SystemExit:  # the backend's way of ending a waiting rank
            raise RuntimeError(f"collective abandoned on rank {rank}: {turns.abandoned}") from None
        finally:
            turns.resume(rank)

    # Every group created wraps sys.excepthook to prefix "[rankN]"; the process keeps its own.
    excepthook = sys.excepthook
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    pg._install_threaded_pg()
    pg.Collective.join = join
    try:
        yield turns
    finally:
        sys.excepthook = excepthook
        pg.Collective.join = original_join
        pg.ProcessLocalGroup.reset()
        pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)


_ONE_RUN = threading.Lock()  # the backend keeps its state in class attributes: one run at a time


def run_torch_threads(world_size: int, fn: Callable, timeout_s: float = 60.0) -> list:
    """``fn(comm)`` on every rank; per-rank results (``fn`` records its own errors).

    Raises TimeoutError naming the ranks that did not finish within ``timeout_s``.
    """
    with _ONE_RUN, _threaded_world(world_size) as turns:
        return _run_ranks(world_size, fn, timeout_s, turns)


def _run_ranks(world_size: int, fn: Callable, timeout_s: float, turns: _Turns) -> list:
    results: list = [None] * world_size
    store = dist.HashStore()

    def body(rank: int) -> None:
        try:
            # Not under the turn: creating the group waits until every rank has joined it.
            dist.init_process_group(BACKEND, rank=rank, world_size=world_size, store=store)
        except Exception:
            results[rank] = {"harness_error": traceback.format_exc()}
            turns.finish(rank)
            return
        world = dist.distributed_c10d._world
        turns.take()
        try:
            results[rank] = fn(TorchDistComm(dist.group.WORLD))
        except BaseException:
            results[rank] = {"harness_error": traceback.format_exc()}
        finally:
            turns.finish(rank)
            turns.give()
            if dist.distributed_c10d._world is world:  # not after a timeout has taken the world down
                _destroy_group()

    threads = [
        threading.Thread(target=body, args=(rank,), daemon=True, name=f"rank{rank}") for rank in range(world_size)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if late:
        turns.end(f"rank(s) {late} did not finish within {timeout_s:.0f}s")
        for thread in threads:
            thread.join(GRACE_S)
        stuck = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
        if stuck:
            raise TimeoutError(f"rank(s) {stuck} did not finish within {timeout_s:.0f}s (outside any collective)")
    return results


def _destroy_group() -> None:
    """Best effort: each run starts fresh threads with a fresh store, so nothing depends on it."""
    try:
        dist.destroy_process_group()
    except AttributeError:  # torch 2.11: its threaded world lacks the ``comms`` that destroying reads
        pass
