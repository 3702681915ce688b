"""Invariants every attention family satisfies, run on every registered family.

The cases are the registered families (`FAMILIES`), the multi-head combinator and a
cosine-similarity family defined below, each built by its entry of
`helpers.FAMILY_EXAMPLES`. A registered family without an entry fails here, so a
family cannot be added without these tests. The cosine family is registered only
for the tests that use it: it checks that a new family is one class, one
`@register` line and one test-table entry (docs/how-to/new-attention-family.md).
Positional families (`helpers.POSITIONAL`) need token positions, which the
invariants on plain particles do not have: tests/test_positional.py holds theirs.

Sizes are tiny (n = 6 tokens in d = 3), and what the invariants compare is computed
once per case (the `case` fixture), eagerly: the primitives compile once for all
families, and each family compiles one jitted velocity (for jit against eager).
"""

import inspect
from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import COMBINATORS, FAMILY_EXAMPLES, POSITIONAL, example_params

import meanfield as mf
from meanfield._attention import FAMILIES, family, name_of, register
from meanfield._attention.base import (
    AbstractAttention,
    AbstractKernelAttention,
    check_blocking,
    check_param_shapes,
)
from meanfield._attention.norms import meanfield_lipschitz, value_norm
from meanfield._custom_types import Param, ParamLike
from meanfield._params import as_param, at


def _unit(v):
    """v / |v| row-wise, 0 for v = 0 (double `where`: finite gradients there)."""
    sq = jnp.sum(v**2, axis=-1, keepdims=True)
    return v * jax.lax.rsqrt(jnp.where(sq > 0, sq, 1))


class CosineAttention(AbstractKernelAttention):
    """Cosine attention: k(x, y) = exp(beta <x, y> / (|x| |y|)), row-normalised.

    The family of docs/how-to/new-attention-family.md, kept in the tests: with
    `@register("cosine")` in meanfield/_attention/cosine.py it would be a library
    family.

    Args:
        V: value matrix (d, d), or a function of t.
        beta: inverse temperature.
        blocking: "auto", "dense" or "blocked".
        block_size: keys per block of the blocked kernel.
    """

    V: Param
    beta: float
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)

    def __init__(
        self,
        V: ParamLike,
        *,
        beta: float = 1.0,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V = as_param(V, "V")
        check_param_shapes(self.V)
        self.beta = float(beta)
        self.blocking, self.block_size = check_blocking(blocking, block_size)

    def features(self, z, x, t):
        """(beta z / |z|, x / |x|, None): log k(z, x) = beta cos(z, x)."""
        return self.beta * _unit(z), _unit(x), None


#: The cosine family's entry of the test table (added by the `cosine` fixture).
COSINE_EXAMPLES = {"beta2": lambda p: CosineAttention(p.V, beta=2.0)}


@pytest.fixture
def cosine():
    """Register the cosine family and its test entry; both removed afterwards."""
    register("cosine")(CosineAttention)
    FAMILY_EXAMPLES["cosine"] = COSINE_EXAMPLES
    yield CosineAttention
    del FAMILIES["cosine"], FAMILY_EXAMPLES["cosine"]


def _variants(name):
    if name == "cosine":
        return COSINE_EXAMPLES
    return FAMILY_EXAMPLES.get(name) or {"missing": None}


CASES = [
    pytest.param((name, variant), id=f"{name}-{variant}")
    for name in [*sorted(FAMILIES), *COMBINATORS, "cosine"]
    if name not in POSITIONAL
    for variant in _variants(name)
]
D, N = 3, 6
P64, P32 = example_params(D), example_params(D, np.float32)
# Sinkhorn stops at |dg| < 1e-10 (float64): two evaluations that round differently
# agree to ~1e-10 there; the other families agree to ~1e-14.
ITERATIVE = dict(rtol=1e-9, atol=1e-9)
# The same operations in float64 on O(1) data: ~1e-14, so 1e-12 has margin.
TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(params=CASES)
def make(request):
    """The example constructor ExampleParams -> attention of one case."""
    name, variant = request.param
    if name == "cosine":
        request.getfixturevalue("cosine")
    if name not in FAMILY_EXAMPLES:
        pytest.fail(
            f"attention family {name!r} is registered but has no entry in "
            "tests/helpers.py FAMILY_EXAMPLES"
        )
    return FAMILY_EXAMPLES[name][variant]


@pytest.fixture(params=[*sorted(FAMILIES), "cosine"])
def family_name(request):
    """Every registered family, and the cosine family registered for the test."""
    if request.param == "cosine":
        request.getfixturevalue("cosine")
    return request.param


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, D))
    # Token 0 alone at s = 0: under the mask it sees only itself.
    s = np.concatenate([[0.0], rng.uniform(0.05, 1.0, N - 1)])
    return SimpleNamespace(
        x=x,
        w=rng.dirichlet(np.ones(N)),
        s=s,
        # As many query points as atoms: velocity_at(z) and velocity share shapes,
        # hence compiled primitives.
        z=rng.normal(size=(N, D)),
        other=rng.normal(size=(N, D)),
        direction=rng.normal(size=(N, D)),
    )


PERM = np.random.default_rng(2).permutation(N)
EPS = 1e-6  # finite-difference step


def _split(x, w, s=None):
    """Atom 0 duplicated, each copy with half its weight (the same measure)."""
    w_split = jnp.concatenate([w, w[:1] / 2]).at[0].set(w[0] / 2)
    x_split = jnp.concatenate([x, x[:1]])
    return x_split, w_split, None if s is None else jnp.concatenate([s, s[:1]])


# Every quantity the invariants compare, computed once per case and eagerly: the
# primitives compile once for all families (same shapes), while a jitted program
# per family and transform would compile ~15 programs per family. Only
# `test_jit_matches_eager` compiles one (`velocity`).
def _unmasked(attn, x, w, z, other, direction):
    # delta_{x_0}, as six coincident atoms (the shapes of `mu`, already compiled).
    mu, lone = mf.Particles(x, w), mf.Particles(jnp.tile(x[:1], (N, 1)), w)
    x_split, w_split, _ = _split(x, w)
    xs = jnp.stack([x, other, x + other])
    far = jnp.concatenate([x, jnp.full((1, D), 10.0)])

    def loss(y):
        return jnp.sum(jnp.sin(attn.velocity(mf.Particles(y, w))))

    return dict(
        v=attn.velocity(mu),
        v_perm=attn.velocity(mf.Particles(x[PERM], w[PERM])),
        v_zero=attn.velocity_at(
            mf.Particles(far, jnp.concatenate([w, jnp.zeros(1)])), z
        ),
        v_at_atoms=attn.velocity_at(mu, x),
        v_z=attn.velocity_at(mu, z),
        v_split=attn.velocity_at(mf.Particles(x_split, w_split), z),
        v_far=attn.velocity_at(mu, 10 * z),
        lone=attn.velocity(lone),
        lone_heads=[head.velocity(lone) for head, _ in attn.flat_heads(0.0, D)],
        batched=jax.vmap(lambda y: attn.velocity(mf.Particles(y, w)))(xs),
        one_by_one=jnp.stack([attn.velocity(mf.Particles(y, w)) for y in xs]),
        grad=jax.grad(loss)(x),
        loss_plus=loss(x + EPS * direction),
        loss_minus=loss(x - EPS * direction),
    )


def _masked(attn, x, s, w, z, other):
    mu = mf.MaskedParticles(x, s, w)
    x_split, w_split, s_split = _split(x, w, s)
    zs = jnp.linspace(0.0, 1.0, z.shape[0])
    moved = jnp.concatenate([x[:1], other[1:]])
    return dict(
        v=attn.velocity(mu),
        v_moved=attn.velocity(mf.MaskedParticles(moved, s, w)),
        split_a=attn.velocity_at(mu, z, positions=zs),
        split_b=attn.velocity_at(
            mf.MaskedParticles(x_split, s_split, w_split), z, positions=zs
        ),
        at_one=attn.velocity_at(mu, z, positions=jnp.ones(z.shape[0])),
    )


velocity = jax.jit(lambda attn, mu: attn.velocity(mu))
_RESULTS: dict = {}


@pytest.fixture
def case(request, make, data):
    """(attention, its unmasked results, its masked results or None if refused).

    Computed once per case and shared by the tests. The only accepted refusal of
    masked measures is a ValueError naming MaskedParticles (Sinkhorn).
    """
    key = request.node.callspec.params["make"]  # (name, variant)
    if key not in _RESULTS:
        attn, d = make(P64), data
        unmasked = _unmasked(attn, d.x, d.w, d.z, d.other, d.direction)
        try:
            masked = _masked(attn, d.x, d.s, d.w, d.z, d.other)
        except ValueError as err:
            assert "MaskedParticles" in str(err)
            masked = None
        _RESULTS[key] = (attn, unmasked, masked)
    return _RESULTS[key]


# Registry.


def test_every_registered_family_has_a_test_example(family_name):
    assert family_name in FAMILY_EXAMPLES, (
        f"add an entry for {family_name!r} to tests/helpers.py FAMILY_EXAMPLES"
    )


def test_family_is_a_final_attention_class_under_its_name(family_name):
    cls = family(family_name)
    assert issubclass(cls, AbstractAttention)
    assert name_of(cls) == family_name
    assert not cls.__abstractmethods__ and not cls.__abstractclassvars__
    assert isinstance(cls.normalised, bool)
    # The CLI builds a family from its name and the constructor's keywords.
    assert next(iter(inspect.signature(cls).parameters)) == "V"


def test_registry_order_and_combinators():
    assert list(FAMILIES)[:7] == [
        "softmax", "l2", "sinkhorn", "unnormalized", "linear", "relu", "sigmoid"
    ]  # fmt: skip
    assert mf.MultiHeadAttention not in FAMILIES.values()
    assert set(FAMILY_EXAMPLES) - set(COMBINATORS) <= set(FAMILIES)


def test_register_refuses_a_taken_name():
    with pytest.raises(ValueError, match="'softmax' is already SoftmaxAttention"):
        register("softmax")(CosineAttention)
    assert FAMILIES["softmax"] is mf.SoftmaxAttention
    with pytest.raises(ValueError, match="unknown attention family 'nope'; known: "):
        family("nope")


# Invariants of the velocity field.


def test_permutation_equivariance(case):
    _, r, _ = case
    np.testing.assert_allclose(r["v_perm"], r["v"][PERM], **ITERATIVE)


def test_zero_weight_atoms_are_ignored(case):
    _, r, _ = case
    np.testing.assert_allclose(r["v_zero"], r["v_z"], **ITERATIVE)


def test_splitting_a_dirac_leaves_the_field_unchanged(case):
    # A duplicated atom carrying half the weight each = the atom with its weight.
    _, r, _ = case
    np.testing.assert_allclose(r["v_split"], r["v_z"], **ITERATIVE)


def test_splitting_a_dirac_leaves_the_masked_field_unchanged(case):
    _, _, m = case
    if m is not None:
        np.testing.assert_allclose(m["split_b"], m["split_a"], **ITERATIVE)


def test_velocity_at_the_atoms_equals_velocity(case):
    _, r, _ = case
    np.testing.assert_allclose(r["v_at_atoms"], r["v"], **TOL)


def test_a_lone_token_moves_along_its_values(case, data):
    # mu = delta_x: each head gives k(x, x) W V x, and a normalised head W V x.
    attn, r, _ = case
    heads = attn.flat_heads(0.0, D)
    assert attn.normalised == all(head.normalised for head, _ in heads)
    total = np.zeros((N, D))
    for (head, W), vh in zip(heads, r["lone_heads"], strict=True):
        vh = np.asarray(vh)
        vx = np.tile(data.x[:1] @ np.asarray(at(head.V, 0.0)).T, (N, 1))
        if head.normalised:
            np.testing.assert_allclose(vh, vx, **TOL)
        else:
            u = vx[0] / np.linalg.norm(vx[0])
            np.testing.assert_allclose(vh - np.outer(vh @ u, u), 0, atol=1e-12)
        total += vh if W is None else vh @ np.asarray(W).T
    np.testing.assert_allclose(r["lone"], total, **TOL)


def test_normalised_families_keep_the_support_bound(case, data):
    # |Gamma_mu(z)| <= sum_h |W_h V_h| max_j |x_j| (the stability radius bound).
    attn, r, _ = case
    if attn.normalised:
        heads = attn.flat_heads(0.0, D)
        rate = sum(float(value_norm(h, 0.0, D, W)) for h, W in heads)
        R = np.max(np.linalg.norm(data.x, axis=1))
        v = np.concatenate([r["v_z"], r["v_far"]])
        assert np.max(np.linalg.norm(v, axis=1)) <= rate * R * (1 + 1e-12)


def test_masked_first_token_sees_only_itself(case):
    _, _, m = case
    if m is not None:
        np.testing.assert_allclose(m["v_moved"][0], m["v"][0], **TOL)


def test_masked_query_at_s_one_sees_every_atom(case):
    _, r, m = case
    if m is not None:
        np.testing.assert_allclose(m["at_one"], r["v_z"], **TOL)


# Transformations and dtypes.


def test_jit_matches_eager(case, data):
    attn, r, _ = case
    assert np.all(np.isfinite(r["v"]))
    eager = attn.velocity(mf.Particles(data.x, data.w))
    np.testing.assert_allclose(r["v"], eager, **TOL)


def test_vmap_over_measures_matches_one_by_one(case):
    _, r, _ = case
    np.testing.assert_allclose(r["batched"], r["one_by_one"], **ITERATIVE)


def test_grad_in_positions_matches_finite_differences(case, data):
    _, r, _ = case
    assert np.all(np.isfinite(r["grad"]))
    fd = (r["loss_plus"] - r["loss_minus"]) / (2 * EPS)
    # Central differences: O(eps^2) truncation + O(1e-16 / eps) rounding ~ 1e-10.
    np.testing.assert_allclose(
        np.sum(r["grad"] * data.direction), fd, rtol=1e-6, atol=1e-8
    )


@pytest.mark.parametrize("params", [P32, P64], ids=["float32", "float64"])
def test_float32_measure_gives_float32_velocity(make, data, params):
    # The measure's dtype wins, whatever the parameters' dtype.
    mu = mf.Particles(data.x.astype(np.float32), data.w.astype(np.float32))
    v = make(params).velocity(mu)
    assert v.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(v)))


def test_bad_value_matrix_is_a_value_error_naming_V(make):
    with pytest.raises(ValueError, match="`V` must have shape"):
        make(P64._replace(V=np.ones((D, D + 1))))


# What the bounds read from the class.


@jax.jit
def _log_kernel_derivatives(head, pts):
    """|grad_x phi|, |grad_y phi| and phi at every pair (x_i, y_j) of `pts`."""

    def phi(x, y):
        q, k, bias = head.features(x[None], y[None], 0.0)
        return (q @ k.T)[0, 0] + (0.0 if bias is None else bias[0])

    def pairs(f):
        return jax.vmap(jax.vmap(f, (None, 0)), (0, None))

    gx, gy = pairs(jax.grad(phi, (0, 1)))(pts, pts)
    return (
        jnp.linalg.norm(gx, axis=-1),
        jnp.linalg.norm(gy, axis=-1),
        pairs(phi)(pts, pts),
    )


def test_kernel_constants_bound_the_log_kernel(make):
    # |grad_x phi| <= c_x R, |grad_y phi| <= c_y R, osc_y phi <= c_o R^2 on B_R,
    # checked at sampled points (half of them on the sphere |x| = R).
    attn, R = make(P64), 1.5
    heads = attn.flat_heads(0.0, D)
    if any(head.kernel_constants(0.0, D) is None for head, _ in heads):
        assert float(meanfield_lipschitz(attn, R, 0.0, D)) == np.inf
        return
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(16, D))
    pts *= R / np.linalg.norm(pts, axis=1, keepdims=True)
    pts[::2] *= rng.uniform(0, 1, (8, 1))
    for head, _ in heads:
        assert isinstance(head, AbstractKernelAttention), "constants need `features`"
        gx, gy, values = (np.asarray(a) for a in _log_kernel_derivatives(head, pts))
        cx, cy, co = (float(c) for c in head.kernel_constants(0.0, D))
        slack = 1 + 1e-12
        assert gx.max() <= cx * R * slack
        assert gy.max() <= cy * R * slack
        assert np.ptp(values, axis=1).max() <= co * R**2 * slack


# A new family: what works without touching the analyses.


def test_a_new_family_is_built_from_its_name_and_analysed(cosine, data):
    # As the CLI does for `[attention] kind = "cosine"`: name -> class -> keywords.
    cls = family("cosine")
    assert {"V", "beta"} <= set(inspect.signature(cls).parameters)
    attn = cls(P64.V, beta=2.0)
    mu = mf.Particles(data.x, data.w)
    sol = mf.layers(mu, attn, 2, t1=0.5)
    assert sol.status == "success" and np.all(np.isfinite(sol.x))
    # No kernel constants: the bounds are +inf, the support bound holds (normalised).
    assert float(mf.lipschitz.meanfield_bound(attn, 1.0)) == np.inf
    log_C, R = mf.wasserstein.gronwall_bound(attn, [0.0, 1.0], 1.0, d=D)
    assert np.isinf(log_C[-1])
    # R(1) = R(0) e^{|V|}; the quadrature is exact for a constant rate.
    np.testing.assert_allclose(R[-1], np.exp(np.linalg.norm(P64.V, 2)), rtol=1e-12)
    with pytest.raises(ValueError, match="proved for softmax attention"):
        mf.lipschitz.upper_bound(attn, 4, 1.0)
    with pytest.raises(ValueError, match="CosineAttention is not supported on Gauss"):
        mf.gaussian.velocity(mf.Gaussian(np.zeros(D), np.eye(D)), attn)
    # And as a head of a multi-head attention, beside an existing family.
    softmax = mf.SoftmaxAttention(P64.V, A=P64.A)
    np.testing.assert_allclose(
        mf.MultiHeadAttention([attn, softmax]).velocity(mu),
        attn.velocity(mu) + softmax.velocity(mu),
        **TOL,
    )


def test_a_new_family_is_accepted_by_the_simulate_configuration(cosine):
    # `[attention] kind = "cosine"` in a `meanfield simulate` TOML file.
    from meanfield._app.simulate_config import build_attention, resolve_config

    cfg = resolve_config({"d": D, "masked": True, "attention": {"kind": "cosine"}})
    attn = build_attention(cfg, jnp.float64)
    assert isinstance(attn, CosineAttention)
    np.testing.assert_array_equal(attn.V, np.eye(D))
