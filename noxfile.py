"""Sessions of shardspec.

    nox -s conformance        # the main job: check implementations against the spec
    SHARDSPEC_QUICK=1 nox -s conformance   # the quick profile (under a minute)
    nox -s tests              # shardspec's own tests
    nox -s fixtures [-- --check]
    nox -s spec [-- --check]  # render spec/SPEC.md
    nox -s bench              # benchmark (meant for a GPU machine)
    nox -s report             # HTML report of reports/conformance.json into reports/html
    nox -s lint               # ruff check and ruff format --check

Torch: the sessions install the CPU build pinned below (override with
SHARDSPEC_TORCH, e.g. SHARDSPEC_TORCH="torch==2.11.0"). To use a torch you
already have (e.g. a CUDA build), run any session in your own environment with
`nox --no-venv -s <session>`: nothing is installed then, so install shardspec
first, keeping your torch:
`pip install -e ".[impl,test]" "torch==$(python -c 'import torch; print(torch.__version__)')"`.
"""

from __future__ import annotations

import glob
import os

import nox
from nox.virtualenv import PassthroughEnv

nox.options.sessions = ["tests", "conformance"]
nox.options.reuse_venv = "yes"

TORCH = os.environ.get("SHARDSPEC_TORCH", "torch==2.13.0")


def pip_install(session: nox.Session, *args: str) -> None:
    """pip install without byte-compiling what it installs: compiling torch's files took 48 of the 66 s of its
    install into a new venv (measured, 2 cores); Python compiles and caches what a run imports anyway."""
    session.install("--no-compile", *args)


def install(session: nox.Session) -> None:
    if isinstance(session.virtualenv, PassthroughEnv):
        session.log("--no-venv: using the current environment as it is")
        return
    # torch first and pinned, so that resolving shardspec never pulls another build.
    pip_install(session, TORCH)
    pip_install(session, "-e", ".[impl,test,bench]")  # bench: the CPU smoke run of the benchmark draws its plots


@nox.session
def tests(session: nox.Session) -> None:
    """shardspec's own tests (spec, reference, fixtures, impl, conformance harness, meta-tests).

    The tests of vLLM's own batch_shard.py read it out of the wheels `nox -s drift` downloads into
    .nox/wheels, else from ../shared/upstream, else skip saying so (tests/vllm_files.py);
    SHARDSPEC_REQUIRE_VLLM_FILES=1 (as .ci/run sets it, after drift) makes a missing file an error."""
    install(session)
    # One xdist worker per core: a worker more sped up a sample of the subprocess tests (173 s -> 137 s) but
    # slowed the whole session on 2 cores (2,608 s of tests in CI, against 1,996-2,272 s with two workers).
    session.run("pytest", "-n", "auto", "tests", *session.posargs)


# The main run's profile: vLLM 0.34's rules under the stricter contract (spec/profiles/vllm-0.34-strict.yaml), where
# no case is outside the contract: must-reject inputs, strided views, every accepted dtype and extension fields
# are all judged. vLLM's own profiles trust their caller and leave those out.
MAIN_PROFILE = ("--shardspec-profile", "vllm-0.34-strict")
# The other profiles, each run after the main one on a budget of its own (20-60 s on 2 CPU cores): vLLM 0.34's
# own contract (what its callers send) at tp 2; vLLM 0.34's owner table, carried by the engine from step to step,
# under the strict contract (tp 3, where production's owners are not a bit mask, with 6 generated cases, the
# multi-step case and every boundary of the table's preconditions); the previous release's and the seed's
# contracts at tp 2 (their fixtures, boundaries and 3 generated cases), so that every profile is shown green.
EXTRA_PROFILE_RUNS = {
    "vllm-0.34": ("--shardspec-profile", "vllm-0.34", "--shardspec-tp", "2", "--shardspec-max-examples", "3"),
    "vllm-0.34-sharded-draft-cache-strict": (
        "--shardspec-profile-file",
        "examples/profiles/vllm-0.34-sharded-draft-cache-strict.yaml",
        "--shardspec-tp",
        "3",
        "--shardspec-max-examples",
        "6",
    ),
    "vllm-0.33": ("--shardspec-profile", "vllm-0.33", "--shardspec-tp", "2", "--shardspec-max-examples", "3"),
    "vllm-seed": ("--shardspec-profile", "vllm-seed", "--shardspec-tp", "2", "--shardspec-max-examples", "3"),
}


# TP inside data parallelism, as engines that run DP attention deploy it: one world of 4 rank processes as 2 TP groups
# of 2 (--tp-groups), each group running and judged on every case, where the default group is the whole world and
# not a TP group; a collective on any group but a rank's own TP group fails INV-WIRE-SEQUENCE. The fixtures chosen
# make every collective a step makes: the exchange, the gathers of ids and counts, of logprobs and of extension
# fields, with drafts, grammar output, a rank that owns nothing and a rejection.
DP_WORLD_CASES = (
    "tp2-decode",
    "tp2-spec-mixed-drafts",
    "tp2-explicit-wide-logprobs",
    "tp2-extensions",
    "tp2-grammar-scrambled",
    "tp2-all-on-rank1",
    "tp2-error-capacity-reqs",
)
DP_WORLD_OPTIONS = ("--shardspec-tp", "2", "--shardspec-tp-groups", "2")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite through its pytest plugin: one test per implementation, tp size and invariant.

    By default the bundled implementations, alone and mixed in one group
    ("reference/production": even ranks run the reference, odd ranks production).
    Arguments after -- go to pytest, e.g. `-- --shardspec-impl my_pkg.adapter:make_sharder
    --shardspec-tp 2,4 -k INV-OWNER` (docs/validate-your-implementation.md lists the options).
    Writes reports/conformance-junit.xml and reports/conformance.json, under MAIN_PROFILE. Without arguments,
    SHARDSPEC_IMPL or SHARDSPEC_PROFILE, a world of two TP groups (DP_WORLD_OPTIONS,
    reports/conformance-dp-world.json) and the profiles of EXTRA_PROFILE_RUNS follow, each on its budget
    (reports/conformance-<label>.json); with them, the run is the default profile's (or the one named).
    """
    install(session)
    os.makedirs("reports", exist_ok=True)  # where the JSON and JUnit reports go
    suite = ("pytest", "--pyargs", "shardspec.conformance", "-p", "no:cacheprovider", "-s", "-p", "no:xdist")
    impl = ("--shardspec-impl", os.environ.get("SHARDSPEC_IMPL", "reference,production,reference/production"))
    own = bool(session.posargs) or any(v in os.environ for v in ("SHARDSPEC_IMPL", "SHARDSPEC_PROFILE"))
    session.run(
        *suite,
        *impl,
        *(() if own else MAIN_PROFILE),
        "--shardspec-json",
        "reports/conformance.json",
        "--junitxml=reports/conformance-junit.xml",
        *session.posargs,
    )
    if own:
        return  # a run of one's own choosing (arguments, another implementation or profile): that run only
    dp_cases = (arg for case in DP_WORLD_CASES for arg in ("--shardspec-case", case))
    reports = ("--shardspec-json", "reports/conformance-dp-world.json", "--junitxml=reports/conformance-dp-junit.xml")
    session.run(*suite, *impl, *MAIN_PROFILE, *DP_WORLD_OPTIONS, *dp_cases, *reports)  # extensions, a rejection
    for label, selection in EXTRA_PROFILE_RUNS.items():
        session.run(
            *suite,
            *impl,
            *selection,
            "--shardspec-json",
            f"reports/conformance-{label}.json",
            f"--junitxml=reports/conformance-{label}-junit.xml",
        )


@nox.session
def report(session: nox.Session) -> None:
    """The HTML compliance report of reports/conformance.json (from `nox -s conformance`) in reports/html.

    With reports/bench (what `nox -s bench` writes) present, its plots and tables are added. Arguments
    after -- go to the report, e.g. `-- older.json` (compared too) or `-- --bench bench/results`.
    """
    install(session)
    bench = ["--bench", "reports/bench"] if os.path.isdir("reports/bench") else []
    session.run(
        "python",
        "-m",
        "shardspec.conformance",
        "report",
        *session.posargs,
        *bench,
        "reports/conformance.json",
        "-o",
        "reports/html",
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (pyflakes, pycodestyle, import order, pyupgrade, bugbear) and ruff's formatter, as configured in
    pyproject.toml; `-- --fix` applies the fixes and formats."""
    if not isinstance(session.virtualenv, PassthroughEnv):
        pip_install(session, "ruff==0.17.6")
    if "--fix" in session.posargs:
        session.run("ruff", "check", "--fix", ".")
        session.run("ruff", "format", ".")
        return
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing of reference/ and impl/'s Python with mutmut, judged by a fast test profile per folder.

    Prints killed / survived / timed out per folder and writes the mutants not caught to reports/mutants.md;
    fails if a survivor of a folder it ran has no reason in docs/mutation-survivors.md, which gives the
    scores and which modules were measured.
    Arguments after -- go to mutation/run.py (e.g. `-- reference`, `-- impl --sample 2`, `-- --worktree`,
    `-- --reuse`). One mutant at a time (`-- --max-children N` for more); docs/mutation-survivors.md gives
    the run times.
    """
    install(session)
    if not isinstance(session.virtualenv, PassthroughEnv):
        # Pinned: mutation/report.py reads mutmut's result files and diffs through its modules.
        pip_install(session, "mutmut==3.8.1")
    session.run("python", "mutation/run.py", *session.posargs)


@nox.session
def fixtures(session: nox.Session) -> None:
    """Regenerate the golden fixtures; `-- --check` fails on drift instead."""
    install(session)
    session.run("python", "-m", "shardspec.fixtures.generate", *session.posargs)


@nox.session
def spec(session: nox.Session) -> None:
    """Render spec/SPEC.md; `-- --check` fails if it is stale."""
    install(session)
    session.run("python", "-m", "shardspec.spec.render", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Reference vs production per-step timings, what a step does, counted, and the deployment-scale grid.

    Arguments after -- go to bench_step.py; its --upstream FILE (vLLM's batch_shard.py) goes to the
    counts and the grid too, and --quick to the grid. The grid (bench/scale_grid.py) writes
    reports/bench/scale.json and PNG plots beside it.
    """
    install(session)
    if not isinstance(session.virtualenv, PassthroughEnv):
        pip_install(session, "-e", ".[bench]")  # matplotlib, for the plots
    session.run("python", "bench/bench_step.py", *session.posargs)
    args = list(session.posargs)
    upstream = args[args.index("--upstream") : args.index("--upstream") + 2] if "--upstream" in args else []
    session.run("python", "bench/step_counts.py", *upstream)
    quick = ["--quick"] if "--quick" in args else []
    session.run(
        "python",
        "bench/scale_grid.py",
        *quick,
        *upstream,
        "--out",
        "reports/bench/scale.json",
        "--plots",
        "reports/bench",
    )


# Each supported vLLM release: the profile it is judged under and its known failures (examples/vllm). The
# first is the newest: `nox -s vllm` runs it; `nox -s vllm -- 0.33.0` another.
VLLM_RELEASES = {
    "0.34.0": ("vllm-0.34", "examples/vllm/known_failures_0.34.yaml"),
    "0.33.0": ("vllm-0.33", "examples/vllm/known_failures_0.33.yaml"),
}
# A release's configurations besides its default one, each judged after it under its own profile with the
# release's known failures: vLLM 0.34.0 with a sharded draft-logits cache, where the cache's owner table
# decides the owners (tp 3, where owners by position and by table differ most; its fixtures, boundaries, the
# multi-step case and 2 generated cases: about 80 s on 2 cores).
VLLM_EXTRA_PROFILES = {"0.34.0": {"vllm-0.34-sharded-draft-cache": ("--tp", "3", "--max-examples", "2")}}


@nox.session
def vllm(session: nox.Session) -> None:
    """An installed vLLM release (its own batch_shard.py, records and TP group) against the spec: examples/vllm.

    `nox -s vllm` runs the newest supported release (0.34.0) under its profile; `nox -s vllm -- 0.33.0` the
    one named (VLLM_RELEASES). Installs vLLM without its dependencies (they would replace the CPU torch with
    a CUDA build), then the pure-Python packages its import and group setup need
    (examples/vllm/requirements.txt), each pip call with torch pinned. Runs every fixture, every
    precondition's boundaries and 5 generated cases at tp 2, one process per rank (gloo and the Triton
    interpreter on a CPU), with the release's known failures as xfails, and writes
    reports/vllm-<release>.json; then the release's other configurations (VLLM_EXTRA_PROFILES) unless
    arguments were given; then, once two releases or more have one, reports/releases.html
    (releases x invariants). Other arguments after -- go to the suite (e.g. `-- 0.33.0 --tp 2,3,4
    --max-examples 25`). A CI budget, measured on 2 cores at load 1-6: 2.5 min a release with the venv
    reused (the suite 110-130 s, reinstalling the other release about 30 s), 3 min from a fresh clone;
    .ci/run runs both releases.
    """
    args = list(session.posargs)
    release = args.pop(0) if args and args[0] in VLLM_RELEASES else next(iter(VLLM_RELEASES))
    if args and args[0][:1].isdigit():
        session.error(f"vLLM {args[0]} is not a supported release ({', '.join(VLLM_RELEASES)})")
    profile, known_failures = VLLM_RELEASES[release]
    if isinstance(session.virtualenv, PassthroughEnv):
        session.log("--no-venv: using the current environment as it is (examples/vllm/README.md: what it needs)")
    else:
        pip_install(session, TORCH)
        pip_install(session, "--no-deps", f"vllm=={release}")
        pip_install(session, "-r", "examples/vllm/requirements.txt", TORCH)
        pip_install(session, "-e", ".[impl,test]", TORCH)
    installed = session.run("python", "-c", "import vllm; print(vllm.__version__)", silent=True).strip()
    if installed.splitlines()[-1] != release:
        session.error(f"vLLM {installed.splitlines()[-1]} is installed, not {release}: run without --no-venv or -R")
    os.makedirs("reports", exist_ok=True)
    # The drift check first: a field of the installed file that no profile covers fails the session.
    session.run("python", "-m", "shardspec.conformance", "upstream", "installed", "--profile", profile)
    suite = ("python", "-m", "shardspec.conformance", "--impl", "shardspec_vllm:make_sharder", "--max-examples", "5")
    # Every case runs (--max-crashes 0): vLLM aborts on several inputs, and a crash is worth seeing each time.
    # --timeout 120: vLLM's kernels at the deployed sizes (1024 requests) take over 30 s a step in the Triton
    # interpreter at tp 3; the cases that made ranks wait until the timeout (invalid inputs) are outside the
    # profiles' contract now, so a long timeout costs nothing.
    judged = ("--timeout", "120", "--no-shrink", "--max-crashes", "0", "--xfails-file", known_failures)
    report = ("--json", f"reports/vllm-{release}.json")
    session.run(*suite, "--profile", profile, "--tp", "2", *judged, *report, *args, env={"PYTHONPATH": "examples/vllm"})
    extras = {} if args else VLLM_EXTRA_PROFILES.get(release, {})  # a run of one's own choosing: that run only
    for extra, extra_args in extras.items():
        report = ("--json", f"reports/vllm-{release}-{extra}.json")
        session.run(*suite, "--profile", extra, *extra_args, *judged, *report, env={"PYTHONPATH": "examples/vllm"})
    if not args:
        # Each defect the known failures name still reproduces on its smallest case (examples/vllm/defects):
        # a defect fixed upstream fails the session until its item and report go.
        session.run("python", "examples/vllm/defects/reproduce.py", known_failures, "--profile", profile)
    # Once both releases have a report (nox -s vllm -- 0.33.0, then nox -s vllm): one page of releases x
    # invariants, a column per release with its known failures' reasons.
    runs = [f"reports/vllm-{r}.json" for r in sorted(VLLM_RELEASES) if os.path.isfile(f"reports/vllm-{r}.json")]
    if len(runs) > 1:
        session.run("python", "-m", "shardspec.conformance", "report", "releases", *runs, "-o", "reports/releases.html")


@nox.session
def drift(session: nox.Session) -> None:
    """The upstream drift check against every supported release's published wheel (VLLM_RELEASES), read as a
    zip (never installed): every field its batch_shard.py touches is covered by the release's profile, and
    every field of the profile is touched. The wheels are downloaded once, without dependencies, into
    .nox/wheels (pip's cache then serves `nox -s vllm`'s install of the newest). `-- PATH [--profile NAME]`
    checks another tree, wheel or batch_shard.py instead. Needs no torch."""
    if not isinstance(session.virtualenv, PassthroughEnv):
        pip_install(session, "pyyaml", "jsonschema")
        pip_install(session, "--no-deps", "-e", ".")
    if session.posargs:
        session.run("python", "-m", "shardspec.conformance", "upstream", *session.posargs)
        return
    wheels = os.path.join(".nox", "wheels")
    for release, (profile, _) in VLLM_RELEASES.items():
        pattern = os.path.join(wheels, f"vllm-{release}-*.whl")
        if not glob.glob(pattern):
            session.run(
                "python", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", wheels,
                f"vllm=={release}",
            )  # fmt: skip
        session.run("python", "-m", "shardspec.conformance", "upstream", glob.glob(pattern)[0], "--profile", profile)
