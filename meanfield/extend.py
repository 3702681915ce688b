"""The extension surface: what code outside the package builds on, by public names.

`meanfield.extend` is to meanfield what `equinox.internal` is to diffrax: the one
public module through which a new attention family, a new noise, a benchmark or a
notebook reaches the pieces of the engine and of the `meanfield` command that the
user-facing namespaces do not show. Nothing outside `meanfield/` imports a
private module (`meanfield._*`, `meanfield.density._sphere`, ...): what it needs
is re-exported here, under the names below (the objects themselves, not copies).
Nothing inside the package imports this module: it sits above every layer,
applications included.

The interfaces themselves are public at the top level: `mf.AbstractAttention`,
`mf.AbstractKernelAttention`, `mf.AbstractIllPosedAttention`, `mf.AbstractNoise`,
`mf.PiecewiseConstant`, `mf.Status`.

Groups:

- Attention families (docs/how-to/new-attention-family.md): `register`,
  `family`, `name_of`, `FAMILIES` (the registry every consumer reads), `Param`,
  `ParamLike` (an array or a function of t), `as_param`, `param_at`,
  `values_at`, `check_param_shapes`, `check_blocking`.
- Noises (subclasses of `mf.AbstractNoise`): `as_sigma`, the noise level's
  validator.
- Normalisations (where the LayerNorm sits): `NORMALIZATIONS`, `ON_SPHERE`,
  `needs_directions`, `normalized_velocity`, `normalized_layer`, `row_norms`.
- Kernels (timed by the accelerator benchmarks): `blocked_softmax_average`,
  `fused_softmax_average`.
- The density on S^2 (timed by benchmarks/sphere_harmonics.py):
  `SphereZonalField`, `SphereGeneralField`, `SPHERE_BLOCK_ELEMENTS`,
  `sphere_synthesis`, `scaled_funk_hecke`.
- Gaussian studies: `queue_slots`.
- Results and benchmarks (what the `meanfield` command writes with, reused by
  the scripts in benchmarks/ and the notebooks): `manifest`, `write_manifest`,
  `savefig_atomic`, `Output`, `use_agg`, `device_name`, `BENCH_COLORS`,
  `BENCH_MARKERS`, `measure_floor`, `floor_seconds`, `bench_problem`,
  `bench_run`, `bench_main`, `cli_main`, `default_tolerance`.

Names load on first use (PEP 562), as the top-level package's do: importing this
module costs nothing, and the fused kernel (Pallas) or the command's modules load
only when a name from them is touched.
"""

import importlib
from typing import TYPE_CHECKING

# Public name -> (module relative to `meanfield`, its name there), by group.
_NAMES = {
    # Attention families.
    "register": ("._attention.registry", "register"),
    "family": ("._attention.registry", "family"),
    "name_of": ("._attention.registry", "name_of"),
    "FAMILIES": ("._attention.registry", "FAMILIES"),
    "Param": ("._custom_types", "Param"),
    "ParamLike": ("._custom_types", "ParamLike"),
    "as_param": ("._params", "as_param"),
    "param_at": ("._attention.base", "param_at"),
    "values_at": ("._attention.base", "values_at"),
    "check_param_shapes": ("._attention.base", "check_param_shapes"),
    "check_blocking": ("._attention.base", "check_blocking"),
    # Noises.
    "as_sigma": ("._noise", "as_sigma"),
    # Normalisations.
    "NORMALIZATIONS": ("._normalization", "NORMALIZATIONS"),
    "ON_SPHERE": ("._normalization", "ON_SPHERE"),
    "needs_directions": ("._normalization", "needs_directions"),
    "normalized_velocity": ("._normalization", "velocity"),
    "normalized_layer": ("._normalization", "layer"),
    "row_norms": ("._linalg", "row_norms"),
    # Kernels.
    "blocked_softmax_average": ("._kernels.blocked", "softmax_average"),
    "fused_softmax_average": ("._kernels.fused", "softmax_average"),
    # The density on S^2.
    "SphereZonalField": (".density._sphere", "ZonalField"),
    "SphereGeneralField": (".density._sphere", "GeneralField"),
    "SPHERE_BLOCK_ELEMENTS": (".density._sphere", "BLOCK_ELEMENTS"),
    "sphere_synthesis": (".density._harmonics", "synthesis"),
    "scaled_funk_hecke": (".density._funk_hecke", "scaled_funk_hecke"),
    # Gaussian studies.
    "queue_slots": (".gaussian._study", "queue_slots"),
    # Results and benchmarks.
    "manifest": ("._app.manifest", "manifest"),
    "write_manifest": ("._app.manifest", "write_manifest"),
    "savefig_atomic": ("._io", "savefig_atomic"),
    "Output": ("._app.report", "Output"),
    "use_agg": ("._app.report", "use_agg"),
    "device_name": ("._app.bench_report", "device_name"),
    "BENCH_COLORS": ("._app.bench_report", "COLORS"),
    "BENCH_MARKERS": ("._app.bench_report", "MARKERS"),
    "measure_floor": ("._app.bench_machine", "measure_floor"),
    "floor_seconds": ("._app.bench_machine", "floor_seconds"),
    "bench_problem": ("._app.bench_cases", "problem"),
    "bench_run": ("._app.bench", "run"),
    "bench_main": ("._app.bench_report", "main"),
    "cli_main": ("._app.cli", "main"),
    "default_tolerance": ("._noisy_solve", "default_tolerance"),
}

# Literal, so that static analysers (ruff, pyright, griffe) see the re-exports;
# tests/test_layout.py checks that it lists exactly the names of `_NAMES`.
__all__ = [
    # Attention families.
    "register",
    "family",
    "name_of",
    "FAMILIES",
    "Param",
    "ParamLike",
    "as_param",
    "param_at",
    "values_at",
    "check_param_shapes",
    "check_blocking",
    # Noises.
    "as_sigma",
    # Normalisations.
    "NORMALIZATIONS",
    "ON_SPHERE",
    "needs_directions",
    "normalized_velocity",
    "normalized_layer",
    "row_norms",
    # Kernels.
    "blocked_softmax_average",
    "fused_softmax_average",
    # The density on S^2.
    "SphereZonalField",
    "SphereGeneralField",
    "SPHERE_BLOCK_ELEMENTS",
    "sphere_synthesis",
    "scaled_funk_hecke",
    # Gaussian studies.
    "queue_slots",
    # Results and benchmarks.
    "manifest",
    "write_manifest",
    "savefig_atomic",
    "Output",
    "use_agg",
    "device_name",
    "BENCH_COLORS",
    "BENCH_MARKERS",
    "measure_floor",
    "floor_seconds",
    "bench_problem",
    "bench_run",
    "bench_main",
    "cli_main",
    "default_tolerance",
]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _NAMES[name]
    value = getattr(importlib.import_module(module, "meanfield"), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # static analysers, IDEs and the API reference see the imports
    from ._app.bench import run as bench_run
    from ._app.bench_cases import problem as bench_problem
    from ._app.bench_machine import floor_seconds, measure_floor
    from ._app.bench_report import COLORS as BENCH_COLORS
    from ._app.bench_report import MARKERS as BENCH_MARKERS
    from ._app.bench_report import device_name
    from ._app.bench_report import main as bench_main
    from ._app.cli import main as cli_main
    from ._app.manifest import manifest, write_manifest
    from ._app.report import Output, use_agg
    from ._attention.base import (
        check_blocking,
        check_param_shapes,
        param_at,
        values_at,
    )
    from ._attention.registry import FAMILIES, family, name_of, register
    from ._custom_types import Param, ParamLike
    from ._io import savefig_atomic
    from ._kernels import blocked as _blocked
    from ._kernels import fused as _fused
    from ._linalg import row_norms
    from ._noise import as_sigma
    from ._noisy_solve import default_tolerance
    from ._normalization import NORMALIZATIONS, ON_SPHERE, needs_directions
    from ._normalization import layer as normalized_layer
    from ._normalization import velocity as normalized_velocity
    from ._params import as_param
    from .density._funk_hecke import scaled_funk_hecke
    from .density._harmonics import synthesis as sphere_synthesis
    from .density._sphere import BLOCK_ELEMENTS as SPHERE_BLOCK_ELEMENTS
    from .density._sphere import GeneralField as SphereGeneralField
    from .density._sphere import ZonalField as SphereZonalField
    from .gaussian._study import queue_slots

    # Assignments, not `from ... import ... as`: the API reference (griffe) cannot
    # follow an import into `_kernels`, a directory without `__init__.py`.
    blocked_softmax_average = _blocked.softmax_average
    """The blocked online-softmax kernel, `_kernels/blocked.py`.

    `blocked_softmax_average(q, keys, key_bias, values, query_pos=None,
    key_pos=None, *, block_q=512, block_k=512, logit_scale=None)`: out_i =
    sum_j softmax_j(<q_i, k_j> + b_j) v_j over keys with s_j <= s_i, queries in
    blocks of `block_q`, keys streamed in blocks of `block_k` (O(n) memory). The
    kernel of `blocking="blocked"`, there with block_q = 4 block_size.
    """
    fused_softmax_average = _fused.softmax_average
    """The fused online-softmax kernel (one Pallas launch), `_kernels/fused.py`.

    `fused_softmax_average(q, keys, key_bias, values, query_pos=None,
    key_pos=None, *, block_q=64, block_k=64, compute_dtype=None,
    logit_scale=None)`: the same quantity as `blocked_softmax_average`, computed
    in one launch (Triton on a GPU, Pallas' interpret mode elsewhere); the kernel
    of `blocking="fused"`. Forward-only: derivatives are the blocked kernel's.
    """
