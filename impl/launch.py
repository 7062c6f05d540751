"""Kernel launches with less Python per call.

A ``kernel[grid](...)`` call binds and specializes every argument and looks the
compiled kernel up on each launch; even ``compiled[grid](...)`` builds a
closure, asks the driver for the current device and stream and prepares launch
metadata each time. The kernels of this package mark every runtime integer
``do_not_specialize`` and every pointer that is not the start of a workspace
region ``do_not_specialize_on_alignment``, so the compiled kernel depends only
on the constexpr values and the dtypes of the caller's tensors.
:class:`Launcher` keys the compiled kernel by exactly these and afterwards
calls its launcher (``CompiledKernel.run``) itself, with the stream read
straight from torch. A caller may give a second argument tuple for direct
launches in which pointers are plain integers (``tensor.data_ptr()``, cached
for buffers that never move), which spares the launcher its pointer lookups;
which tuple is used is decided once per launch, so a hook installed between
two launches never sees integers where Triton expects tensors.

Under Triton 3.6, whose launcher's argument layout was read and checked, a
kernel that needs no scratch memory is launched through the C function behind
``CompiledKernel.run`` (its Python frame only allocates scratch memory and
forwards the arguments); other versions keep ``run``.

The first launch of a key, every launch under the interpreter and every launch
while a Triton launch hook is installed (profilers) go through Triton.
``SHARDSPEC_DIRECT_LAUNCH=0`` sends every launch through Triton (for comparison),
``SHARDSPEC_BARE_LAUNCH=0`` keeps ``run`` on Triton 3.6.
"""

from __future__ import annotations

import os
import sys

import torch
import triton

_DIRECT = os.environ.get("TRITON_INTERPRET") != "1" and os.environ.get("SHARDSPEC_DIRECT_LAUNCH") != "0"


def _runtime_knobs():
    """Triton's launch-hook settings (``triton.knobs.runtime``), or None where this Triton has none."""
    knobs = getattr(triton, "knobs", None)  # Triton >= 3.4
    runtime = getattr(knobs, "runtime", None)
    return runtime if hasattr(runtime, "launch_enter_hook") else None


def _active(hook) -> bool:
    """A hook is None, a callable, or (Triton >= 3.5) a chain that may be empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


class Launcher:
    def __init__(self, kernel):
        self.kernel = kernel
        self._direct: dict = {}
        self._knobs = _runtime_knobs() if _DIRECT else None

    def __call__(
        self, num_programs: int, key: tuple, args: tuple, constexprs: dict, direct_args: tuple | None = None
    ) -> None:
        """Launch ``num_programs`` programs on CUDA device ``key[0]`` (an index; None on the CPU).

        ``key`` must also hold every constexpr value and caller dtype. ``args`` hold tensors;
        ``direct_args``, where given, the same arguments with some pointers as integers, used
        only by a direct launch.
        """
        direct = self._direct.get(key)
        if direct is not None and not self._hooked():
            direct(num_programs, args if direct_args is None else direct_args)
            return
        result = self.kernel[(num_programs,)](*args, **constexprs)
        if self._knobs is not None and hasattr(result, "packed_metadata") and _constexprs_last(self.kernel, constexprs):
            self._direct[key] = _direct_launch(result, key[0], tuple(constexprs.values()))

    def _hooked(self) -> bool:
        return _active(self._knobs.launch_enter_hook) or _active(self._knobs.launch_exit_hook)


def _direct_launch(compiled, device_index: int, constexpr_values: tuple):
    """A launch of ``compiled`` on the device's current stream, as Triton's runner does it."""
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    current_stream = torch._C._cuda_getCurrentRawStream
    bare = _bare_launch(run)
    if bare is not None:
        cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

        def launch(num_programs: int, args: tuple) -> None:
            # No scratch memory and no hooks: what run() would pass, without its Python frame.
            bare(
                num_programs,
                1,
                1,
                current_stream(device_index),
                function,
                cooperative,
                pdl,
                None,
                None,
                metadata,
                None,
                None,
                None,
                *args,
                *constexpr_values,
            )

        return launch

    def launch(num_programs: int, args: tuple) -> None:
        # No launch hook is active (checked by the caller): no launch metadata, no hooks to call.
        run(
            num_programs,
            1,
            1,
            current_stream(device_index),
            function,
            metadata,
            None,
            None,
            None,
            *args,
            *constexpr_values,
        )

    return launch


# The argument format of the C launch function behind Triton 3.6's CudaLauncher: grid, stream, function,
# cooperative and PDL flags, then global scratch, profile scratch, kernel metadata, launch metadata and
# the two hooks. Other Triton versions order these differently: they keep run().
_BARE_VERSION, _BARE_FORMAT = "3.6.", "iiiKKppOOOOOO"


def _bare_launch(run):
    """``run``'s C launch function where calling it directly is known to equal ``run(...)``, else None."""
    driver = sys.modules.get(type(run).__module__)
    if (
        not triton.__version__.startswith(_BARE_VERSION)
        or getattr(driver, "_BASE_ARGS_FORMAT", None) != _BARE_FORMAT
        or getattr(run, "global_scratch_size", 1)
        or getattr(run, "profile_scratch_size", 1)
        or os.environ.get("SHARDSPEC_BARE_LAUNCH") == "0"
    ):
        return None  # scratch memory would have to be allocated per launch, as run() does
    return getattr(run, "launch", None)


def _constexprs_last(kernel, constexprs: dict) -> bool:
    """Direct launches pass constexprs positionally after the runtime arguments."""
    names = list(kernel.arg_names)
    return names[len(names) - len(constexprs) :] == list(constexprs)
