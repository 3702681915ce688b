"""First call of `mf.simulate`, `mf.gaussian.simulate`, `mf.layers` in a fresh process.

Each case runs in its own Python process and times the first call (the clock
starts after `import meanfield` and after the data are built), split by JAX's own
events into tracing, lowering to MLIR and XLA compilation (which includes the
persistent cache's read and write), beside the import of the engine modules the
call is the first to touch (`import_s`) and the number of XLA programs compiled.
Every case runs twice against one persistent-cache directory: "cold" (empty
directory: what a first run pays) and "warm" (the same programs compiled by the
cold run: what every later process pays); "no cache" runs with
MEANFIELD_COMPILATION_CACHE=0. Repeated calls are timed too (`mf.layers` must
not recompile), and so is a sweep: calls at other horizons t1 (another length
of the solver clock) with other save times of the same shape, which must reuse
the compiled solve (`sweep_s`, the slowest such call, and `sweep_programs`).

    python benchmarks/first_call.py    # out/benchmarks/first_call_<platform>.json
    python benchmarks/first_call.py --out benchmarks/results   # the committed one
    python benchmarks/first_call.py --cases simulate --repeats 5   # one case
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: A checkout whose meanfield the children import instead (`--source`).
SOURCE = None

CASES = {
    # The case: n = 256 tokens on S^2, t1 = 20, 101 saves.
    "simulate": """
import numpy as np, jax.numpy as jnp
g = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32)
mu = mf.Particles(g / np.linalg.norm(g, axis=1, keepdims=True))
eye = np.eye(3, dtype=np.float32)
NAMES = ("simulate", "SoftmaxAttention")
run = lambda t1: mf.simulate(mu, mf.SoftmaxAttention(eye, A=eye), t1,
    saveat=np.linspace(0, t1, 101), normalization="sphere").x
call = lambda: run(20.0)
sweep = [lambda t1=t1: run(t1) for t1 in (24.0, 5.0, 100.0, 15.0)]
""",
    "gaussian.simulate": """
import numpy as np
gauss = mf.Gaussian(np.zeros(2), np.eye(2))
attn = mf.SoftmaxAttention(np.eye(2), A=np.array([[0.8, 0.1], [0.0, -0.5]]))
NAMES = ("gaussian",)
run = lambda t1: mf.gaussian.simulate(gauss, attn, t1,
    saveat=np.linspace(0, t1, 11)).cov
call = lambda: run(5.0)
sweep = [lambda t1=t1: run(t1) for t1 in (6.0, 1.0, 40.0)]
""",
    "layers": """
import numpy as np
g = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32)
mu = mf.Particles(g / np.linalg.norm(g, axis=1, keepdims=True))
eye = np.eye(3, dtype=np.float32)
NAMES = ("layers", "SoftmaxAttention")
call = lambda: mf.layers(mu, mf.SoftmaxAttention(eye, A=eye), 20,
    normalization="sphere").x
""",
}

# Import meanfield from SOURCE: ahead on the path, and without the finder of an
# editable install (which would map the name to the installed checkout).
FROM_SOURCE = """
import sys
sys.path.insert(0, %r)
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in
    getattr(f, "__module__", "") + getattr(f, "__name__", "")]
"""

CHILD = """
import json, time, jax
events, programs = {}, []
def listen(name, secs, **kw):
    events[name] = events.get(name, 0.0) + secs
    if name.endswith("backend_compile_duration"):
        programs.append(kw.get("fun_name"))
jax.monitoring.register_event_duration_secs_listener(listen)
import meanfield as mf
%s
events.clear(); programs.clear()
start = time.perf_counter()
for name in NAMES:  # the engine modules the call is the first to import
    getattr(mf, name)
imported = time.perf_counter() - start
jax.block_until_ready(call())
first = time.perf_counter() - start
again = []
for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready(call())
    again.append(time.perf_counter() - start)
short = lambda k: sum(v for n, v in events.items() if n.endswith(k))
phases = {k: short(k) for k in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
    "backend_compile_duration", "cache_retrieval_time_sec")}
swept, before = [], len(programs)
for other in globals().get("sweep", []):
    start = time.perf_counter()
    jax.block_until_ready(other())
    swept.append(time.perf_counter() - start)
print(json.dumps(dict(first_s=first, repeat_s=again, platform=jax.default_backend(),
    sweep_s=max(swept, default=0.0), sweep_programs=len(programs) - before,
    import_s=imported, programs=programs[:before],
    trace_s=phases["jaxpr_trace_duration"],
    lower_s=phases["jaxpr_to_mlir_module_duration"],
    compile_s=phases["backend_compile_duration"],
    cache_retrieval_s=phases["cache_retrieval_time_sec"])))
"""


def _run(case: str, cache: str | None) -> dict:
    env = dict(os.environ)
    env["MEANFIELD_COMPILATION_CACHE"] = cache if cache is not None else "0"
    code = CHILD % CASES[case]
    if SOURCE is not None:  # another checkout's meanfield (a before/after pair)
        code = FROM_SOURCE % SOURCE + code
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="out/benchmarks",
        help="output directory (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="fresh processes per case and setting; medians reported (default: 3)",
    )
    parser.add_argument(
        "--source",
        default=None,
        help="directory holding the meanfield package to time (default: the "
        "installed one; e.g. a worktree of an earlier commit)",
    )
    parser.add_argument(
        "--name",
        default="first_call",
        help="output file name stem (default: %(default)s)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=list(CASES),
        default=list(CASES),
        help="cases to run (default: all)",
    )
    args = parser.parse_args()
    global SOURCE
    SOURCE = None if args.source is None else str(Path(args.source).resolve())
    results, platform = {}, "cpu"
    for case in args.cases:
        rows = {"no cache": [], "cold": [], "warm": []}
        for _ in range(args.repeats):
            rows["no cache"].append(_run(case, None))
            with tempfile.TemporaryDirectory() as cache:
                rows["cold"].append(_run(case, cache))
                rows["warm"].append(_run(case, cache))
        platform = rows["warm"][0]["platform"]
        keys = ("first_s", "import_s", "trace_s", "lower_s", "compile_s")
        results[case] = {
            setting: {key: statistics.median(r[key] for r in runs) for key in keys}
            | {
                "repeat_s": statistics.median(min(r["repeat_s"]) for r in runs),
                "programs": statistics.median(len(r["programs"]) for r in runs),
                "sweep_s": statistics.median(r.get("sweep_s", 0.0) for r in runs),
                "sweep_programs": statistics.median(
                    r.get("sweep_programs", 0) for r in runs
                ),
            }
            for setting, runs in rows.items()
        }
        for setting, row in results[case].items():
            print(
                f"{case:18s} {setting:8s} first call {row['first_s']:5.2f} s "
                f"(import {row['import_s']:.2f}, trace {row['trace_s']:.2f}, "
                f"lower {row['lower_s']:.2f}, compile {row['compile_s']:.2f}; "
                f"{row['programs']:g} programs); "
                f"repeated call {row['repeat_s']:.3f} s; "
                f"other t1 and saves {row['sweep_s']:.3f} s "
                f"({row['sweep_programs']:g} programs)"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}_{platform}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(repeats=args.repeats, cases=results), indent=1))
    tmp.replace(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
