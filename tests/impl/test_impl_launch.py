"""The direct-launch path's decisions (the launches themselves run in tests/gpu)."""

from types import SimpleNamespace

from shardspec.impl import launch
from shardspec.impl.kernels import pack_kernel, shard_plan_kernel


class Chain:
    """Triton >= 3.5 keeps launch hooks in a chain that is never None, only empty."""

    def __init__(self, *calls):
        self.calls = list(calls)


def test_hook_is_active_only_when_something_would_be_called():
    assert not launch._active(None)
    assert not launch._active(Chain())
    assert launch._active(Chain(print))
    assert launch._active(print)  # Triton < 3.5: the hook itself


def test_launcher_goes_through_triton_while_a_hook_is_active():
    launcher = launch.Launcher(shard_plan_kernel)
    launcher._knobs = SimpleNamespace(launch_enter_hook=Chain(), launch_exit_hook=Chain())
    launcher._direct[("key",)] = lambda *args: None
    assert launcher.ready(("key",))
    launcher._knobs.launch_enter_hook = Chain(print)  # e.g. a profiler
    assert not launcher.ready(("key",))
    assert not launcher.ready(("other",))


def test_constexprs_are_the_last_parameters_of_every_kernel():
    """Direct launches pass constexprs positionally after the runtime arguments."""
    plan = dict(TP=2, RANK=0, TP_PAD=2, BLOCK=4, ROWS_PAD=1, LOOP_END=0)
    assert launch._constexprs_last(shard_plan_kernel, plan)
    assert not launch._constexprs_last(shard_plan_kernel, dict(reversed(list(plan.items()))))
    assert launch._constexprs_last(pack_kernel, dict.fromkeys(
        ["HAS_OUTPUT", "HAS_NANS", "HAS_LOGPROBS", "LOCAL_LOGPROBS", "BLOCK", "ROWS_PAD", "SAMPLED_PAD", "COLS_PAD"]))
