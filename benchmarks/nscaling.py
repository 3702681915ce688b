"""n-scaling benchmark of one softmax velocity evaluation over n and d.

The same as `meanfield bench` (see meanfield/_app/bench_config.py for the options):

    python benchmarks/nscaling.py --ns 2^10 2^14 --ds 2 16 --impls numpy jax_blocked
    python benchmarks/nscaling.py --quick
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)  # float64 reference; timings are float32

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from meanfield.extend import bench_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(bench_main())
