"""The CUDA-graph step is an example, not part of the package: its modules (examples/cuda_graph_step) are
imported by their top-level names, as the tests of the other examples import theirs; ``impl_steps`` is
tests/impl's helper for running and comparing whole steps."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cuda_graph_step"

for folder in (EXAMPLE, ROOT / "tests" / "impl"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
