"""The direct-launch path's decisions (the launches themselves run in tests/gpu)."""

from types import SimpleNamespace

from shardspec.impl import launch
from shardspec.impl.gather_kernels import pack_kernel
from shardspec.impl.shard_kernel import shard_plan_kernel


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
    """A direct launch takes the integer-pointer arguments; with a hook, Triton gets the tensors."""
    launched = []
    launcher = launch.Launcher(shard_plan_kernel)
    launcher._knobs = SimpleNamespace(launch_enter_hook=Chain(), launch_exit_hook=Chain())
    launcher._direct[("key",)] = lambda num_programs, args: launched.append(("direct", args))
    launcher.kernel = {(3,): lambda *args, **constexprs: launched.append(("triton", args))}
    launcher(3, ("key",), ("tensor",), {}, ("address",))
    launcher(3, ("key",), ("tensor",), {})
    launcher._knobs.launch_exit_hook = Chain(print)  # e.g. a profiler
    launcher(3, ("key",), ("tensor",), {}, ("address",))
    launcher._knobs.launch_exit_hook = Chain()
    launcher(3, ("other",), ("tensor",), {}, ("address",))
    assert launched == [
        ("direct", ("address",)),
        ("direct", ("tensor",)),
        ("triton", ("tensor",)),
        ("triton", ("tensor",)),
    ]


def test_constexprs_are_the_last_parameters_of_every_kernel():
    """Direct launches pass constexprs positionally after the runtime arguments."""
    plan = dict(TP=2, RANK=0, TP_PAD=2, BLOCK=4, ROWS_PAD=1, LOOP_END=0, BY_POSITION=False, HOST_OWNERS=False)
    assert launch._constexprs_last(shard_plan_kernel, plan)
    assert not launch._constexprs_last(shard_plan_kernel, dict(reversed(list(plan.items()))))
    assert launch._constexprs_last(
        pack_kernel,
        dict.fromkeys(
            ["HAS_OUTPUT", "HAS_NANS", "HAS_LOGPROBS", "LOCAL_LOGPROBS", "BLOCK", "ROWS_PAD", "SAMPLED_PAD", "COLS_PAD"]
        ),
    )


def _fake_run(module_name: str, fmt, global_scratch=0, profile_scratch=0):
    """An object shaped like Triton's CudaLauncher, whose class lives in a module with ``fmt``."""
    import sys
    import types

    module = types.ModuleType(module_name)
    if fmt is not None:
        module._BASE_ARGS_FORMAT = fmt
    cls = type("CudaLauncher", (), {"__module__": module_name})
    sys.modules[module_name] = module
    run = cls()
    run.launch, run.global_scratch_size, run.profile_scratch_size = print, global_scratch, profile_scratch
    return run


def test_bare_launch_only_where_the_launcher_layout_is_known(monkeypatch):
    import triton

    name = "shardspec_test_fake_driver"
    monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    monkeypatch.delenv("SHARDSPEC_BARE_LAUNCH", raising=False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert launch._bare_launch(_fake_run(name, launch._BARE_FORMAT)) is print
    assert launch._bare_launch(_fake_run(name, "iiiKKOOOOOO")) is None  # another argument layout
    assert launch._bare_launch(_fake_run(name, None)) is None
    assert launch._bare_launch(_fake_run(name, launch._BARE_FORMAT, global_scratch=64)) is None
    assert launch._bare_launch(_fake_run(name, launch._BARE_FORMAT, profile_scratch=64)) is None
    monkeypatch.setenv("SHARDSPEC_BARE_LAUNCH", "0")
    assert launch._bare_launch(_fake_run(name, launch._BARE_FORMAT)) is None
    monkeypatch.delenv("SHARDSPEC_BARE_LAUNCH")
    monkeypatch.setattr(triton, "__version__", "3.9.0")  # same format string, other order of its objects
    assert launch._bare_launch(_fake_run(name, launch._BARE_FORMAT)) is None
