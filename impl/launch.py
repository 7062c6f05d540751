"""Kernel launches with less Python per call.

A ``kernel[grid](...)`` call binds and specializes every argument and looks the
compiled kernel up on each launch. The kernels of this package mark every
runtime integer ``do_not_specialize`` and every pointer that is not the start of
a workspace region ``do_not_specialize_on_alignment``, so the compiled kernel
depends only on the constexpr values and the dtypes of the caller's tensors. :class:`Launcher`
keys the compiled kernel by exactly these and launches it directly; the first
launch of a key (and every launch under the interpreter) goes through Triton.
``SHARDSPEC_DIRECT_LAUNCH=0`` sends every launch through Triton (for comparison).
"""

from __future__ import annotations

import os

_DIRECT = os.environ.get("TRITON_INTERPRET") != "1" and os.environ.get("SHARDSPEC_DIRECT_LAUNCH") != "0"


class Launcher:
    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict = {}

    def __call__(self, num_programs: int, key: tuple, args: tuple, constexprs: dict) -> None:
        """Launch ``num_programs`` programs. ``key`` must hold every constexpr value and caller dtype."""
        compiled = self._compiled.get(key)
        if compiled is not None:
            compiled[(num_programs, 1, 1)](*args, *constexprs.values())
            return
        result = self.kernel[(num_programs,)](*args, **constexprs)
        if _DIRECT and hasattr(result, "packed_metadata") and _constexprs_last(self.kernel, constexprs):
            self._compiled[key] = result


def _constexprs_last(kernel, constexprs: dict) -> bool:
    """Direct launches pass constexprs positionally after the runtime arguments."""
    names = list(kernel.arg_names)
    return names[len(names) - len(constexprs):] == list(constexprs)
