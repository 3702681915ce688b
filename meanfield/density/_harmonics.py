"""Spherical harmonics on S^2: a Gauss-Legendre grid and its transforms.

A real function f on S^2 of degree < L (band limit L) is

    f(theta, phi) = sum_{l < L} sum_{|m| <= l} a_lm Y_lm(theta, phi),
    Y_lm = Pbar_l^m(cos theta) e^{i m phi},

Pbar_l^m the associated Legendre functions normalised so that the Y_lm are
orthonormal on S^2 (no Condon-Shortley phase). f real gives
a_{l,-m} = (-1)^m conj(a_lm): only m >= 0 is stored, as a complex (L, L) array
indexed [l, m], 0 where m > l.

The grid has nlat Gauss-Legendre nodes in cos(theta) (never a pole) and nlon
equispaced longitudes phi_k = 2 pi k / nlon. Its quadrature
sum_jk w_j (2 pi / nlon) g(theta_j, phi_k) integrates exactly every polynomial
of degree <= 2 nlat - 1 in cos(theta) times e^{i m phi} with |m| < nlon. With
nlat = ceil(3L / 2), nlon = 3L (the 3/2 rule) it is exact for degree 3L - 3,
the degree of the integrand rho (grad Z . grad conj Y_lm) of the weak
divergence when rho and Z have degree < L: the quadratic products of the
density solver are computed without aliasing.

The forward transform (analysis) is an rfft in longitude, then for each m a
product with the table Pbar_l^m(cos theta_j) times the weights; the inverse
(synthesis) the reverse: O(L^2 nlat) for the Legendre part, the tables
(L, L, nlat) built once in NumPy float64 by the stable three-term recurrence.
Gradients use the table of d Pbar_l^m / d theta and i m / sin(theta).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float


def _legendre_values(n: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P_n(x), P_n'(x)) by the three-term recurrence."""
    p0, p1 = np.ones_like(x), x.copy()
    for k in range(1, n):
        p0, p1 = p1, ((2 * k + 1) * x * p1 - k * p0) / (k + 1)
    return p1, n * (x * p1 - p0) / (x**2 - 1)


def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes (increasing) and weights on [-1, 1], shape (n,) each.

    NumPy's `leggauss` refined by Newton steps on P_n: its own nodes leave the
    harmonics' orthonormality at 6e-13 for n = 240, the refined ones at 2e-14
    (measured), and the weights 2 / ((1 - x^2) P_n'(x)^2) follow the nodes.
    """
    x, _ = np.polynomial.legendre.leggauss(n)
    for _ in range(3):
        p, dp = _legendre_values(n, x)
        x = x - p / dp
    _, dp = _legendre_values(n, x)
    return x, 2 / ((1 - x**2) * dp**2)


def _legendre_tables(L: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pbar_l^m(x_j) and d Pbar_l^m / d theta at x_j = cos(theta_j): (L, L, nlat) each.

    Indexed [m, l, j], 0 where l < m. Recurrences (orthonormal form, stable):
    Pbar_m^m = sqrt((2m + 1) / (2m)) sin(theta) Pbar_{m-1}^{m-1},
    Pbar_l^m = a_lm (x Pbar_{l-1}^m - b_lm Pbar_{l-2}^m), and
    sin(theta) d Pbar_l^m / d theta = l x Pbar_l^m - c_lm Pbar_{l-1}^m.
    Values below ~1e-300 near the poles at large m underflow to 0: they are
    that small against the O(1) values of the same functions.
    """
    nlat = x.shape[0]
    s = np.sqrt(1 - x**2)
    P = np.zeros((L, L, nlat))
    m = np.arange(L)
    # Diagonal Pbar_m^m for every m, then l = m + k for all m at once.
    diag = np.empty((L, nlat))
    diag[0] = np.sqrt(1 / (4 * np.pi))
    for k in range(1, L):
        diag[k] = np.sqrt((2 * k + 1) / (2 * k)) * s * diag[k - 1]
    P[m, m] = diag
    mm = m[:, None].astype(np.float64)
    for k in range(1, L):
        rows = m[m + k < L]
        ell = (rows + k).astype(np.float64)[:, None]
        mr = mm[rows]
        a = np.sqrt((4 * ell**2 - 1) / (ell**2 - mr**2))
        prev = P[rows, rows + k - 1]
        if k == 1:
            P[rows, rows + k] = a * x * prev
        else:
            b = np.sqrt(((ell - 1) ** 2 - mr**2) / (4 * (ell - 1) ** 2 - 1))
            P[rows, rows + k] = a * (x * prev - b * P[rows, rows + k - 2])
    ell = np.arange(L, dtype=np.float64)[None, :, None]
    mm = mm[:, :, None]
    c = np.sqrt(
        np.maximum((2 * ell + 1) * (ell**2 - mm**2), 0) / np.maximum(2 * ell - 1, 1)
    )
    P_prev = np.concatenate([np.zeros((L, 1, nlat)), P[:, :-1]], axis=1)
    dP = (ell * x * P - c * P_prev) / s
    dP[ell[0, :, 0][None, :] < mm[:, :, 0]] = 0  # exact zeros where l < m
    return P, dP


class SphereGrid(eqx.Module):
    """The Gauss-Legendre grid of band limit L and its spherical-harmonic tables.

    Use `sphere_grid(L)` to build one. Grid values are arrays (nlat, nlon),
    latitude rows from north (theta near 0) to south; `nodes` and `weights`
    flatten them row by row (M = nlat nlon).

    Attributes:
        L: band limit: degrees 0..L-1.
        nlat: Gauss-Legendre nodes in cos(theta), ceil(3L / 2).
        nlon: equispaced longitudes, 3L.
        cos_theta: cos(theta_j), shape (nlat,), decreasing.
        sin_theta: sin(theta_j) > 0, shape (nlat,).
        lat_weights: Gauss-Legendre weights, shape (nlat,), summing to 2.
        legendre: Pbar_l^m(cos theta_j), shape (L, L, nlat), indexed [m, l, j].
        legendre_dtheta: d Pbar_l^m / d theta at the nodes, same shape.
    """

    L: int = eqx.field(static=True)
    nlat: int = eqx.field(static=True)
    nlon: int = eqx.field(static=True)
    cos_theta: np.ndarray
    sin_theta: np.ndarray
    lat_weights: np.ndarray
    legendre: np.ndarray
    legendre_dtheta: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """(nlat, nlon), the shape of grid values."""
        return (self.nlat, self.nlon)

    @property
    def theta(self) -> Float[Array, " nlat"]:
        """Colatitudes theta_j in (0, pi), shape (nlat,), increasing."""
        return _xp(self.cos_theta).arccos(self.cos_theta)

    @property
    def phi(self) -> np.ndarray:
        """Longitudes phi_k = 2 pi k / nlon, shape (nlon,)."""
        return 2 * np.pi * np.arange(self.nlon) / self.nlon

    @property
    def nodes(self) -> Float[Array, "M 3"]:
        """Cartesian nodes (sin t cos p, sin t sin p, cos t), shape (M, 3)."""
        xp = _xp(self.cos_theta)
        ct, st = self.cos_theta[:, None], self.sin_theta[:, None]
        p = self.phi[None, :]
        xyz = xp.stack(
            xp.broadcast_arrays(st * np.cos(p), st * np.sin(p), ct + 0 * p), axis=-1
        )
        return xyz.reshape(-1, 3)

    @property
    def weights(self) -> Float[Array, " M"]:
        """Quadrature weights w_j 2 pi / nlon at the nodes, shape (M,), sum 4 pi."""
        xp = _xp(self.lat_weights)
        w = self.lat_weights[:, None] * xp.full((1, self.nlon), 2 * np.pi / self.nlon)
        return w.reshape(-1)

    def coefficients(
        self, values: Float[ArrayLike, "... nlat nlon"]
    ) -> Complex[np.ndarray, "... L L"]:
        """Spherical-harmonic coefficients a_lm of grid values, in float64.

        The grid's quadrature of f conj(Y_lm) (`analysis`): the projection of f
        on the degrees < L. Orthonormal Y_lm = Pbar_l^m(cos theta) e^{i m phi},
        no Condon-Shortley phase; only m >= 0 is stored (f real).

        Args:
            values: real values at the nodes, shape (..., nlat, nlon).

        Returns:
            Complex coefficients, shape (..., L, L), indexed [l, m] (0 for m > l).
        """
        with jax.enable_x64(True):
            return np.array(analysis(self, jnp.asarray(values, jnp.float64)))

    def values(
        self, coeffs: Complex[ArrayLike, "... L L"]
    ) -> Float[np.ndarray, "... nlat nlon"]:
        """Grid values of sum_lm a_lm Y_lm, in float64 (`synthesis`).

        Args:
            coeffs: complex coefficients, shape (..., L, L), indexed [l, m].

        Returns:
            Real values at the nodes, shape (..., nlat, nlon).
        """
        with jax.enable_x64(True):
            return np.array(synthesis(self, jnp.asarray(coeffs, jnp.complex128)))

    def tangent_frame(self) -> tuple[Float[Array, "M 3"], Float[Array, "M 3"]]:
        """Unit vectors (e_theta, e_phi) at the nodes, shape (M, 3) each."""
        xp = _xp(self.cos_theta)
        ct, st = self.cos_theta[:, None], self.sin_theta[:, None]
        cp, sp = np.cos(self.phi)[None, :], np.sin(self.phi)[None, :]
        zero = 0 * ct
        e_theta = xp.stack(xp.broadcast_arrays(ct * cp, ct * sp, -st + 0 * cp), -1)
        e_phi = xp.stack(xp.broadcast_arrays(-sp + zero, cp + zero, zero + 0 * cp), -1)
        return e_theta.reshape(-1, 3), e_phi.reshape(-1, 3)


def _xp(a):
    """NumPy for NumPy arrays (a grid built on the host), else jax.numpy (traced)."""
    return np if isinstance(a, np.ndarray) else jnp


def grid_size(L: int) -> tuple[int, int]:
    """(nlat, nlon) = (ceil(3L / 2), 3L): exact quadrature of degree 3L - 3."""
    return (3 * L + 1) // 2, 3 * L


def sphere_grid(L: int) -> SphereGrid:
    """The Gauss-Legendre grid of band limit L (degrees 0..L-1).

    Built once per L and kept (the last 4): the tables take ~1 s at L = 160.

    Args:
        L: band limit, an integer >= 2.

    Returns:
        A `SphereGrid` with nlat = ceil(3L / 2), nlon = 3L (module docstring).

    Raises:
        ValueError: L not an integer >= 2.
    """
    if isinstance(L, bool) or not isinstance(L, int | np.integer) or L < 2:
        raise ValueError(f"`L` must be an integer >= 2; got {L!r}.")
    return _build_grid(int(L))


@functools.lru_cache(maxsize=4)
def _build_grid(L: int) -> SphereGrid:
    nlat, nlon = grid_size(L)
    x, w = gauss_legendre(nlat)
    x, w = x[::-1].copy(), w[::-1].copy()  # north to south
    P, dP = _legendre_tables(L, x)
    return SphereGrid(
        L=L,
        nlat=nlat,
        nlon=nlon,
        cos_theta=x,
        sin_theta=np.sqrt(1 - x**2),
        lat_weights=w,
        legendre=P,
        legendre_dtheta=dP,
    )


def degrees(L: int) -> np.ndarray:
    """The degree l of every coefficient [l, m], shape (L, 1) (broadcasts)."""
    return np.arange(L, dtype=np.float64)[:, None]


def orders(L: int) -> np.ndarray:
    """The order m of every coefficient [l, m], shape (1, L) (broadcasts)."""
    return np.arange(L, dtype=np.float64)[None, :]


def laplacian_eigenvalues(L: int) -> np.ndarray:
    """-l (l + 1), the eigenvalues of the Laplace-Beltrami operator, shape (L,)."""
    ell = np.arange(L, dtype=np.float64)
    return -ell * (ell + 1)


def _legendre_sum(table, c):
    """g[b, j, m] = sum_l c[b, l, m] table[m, l, j], in real arithmetic.

    The complex coefficients go in as a batch of real and imaginary parts: a
    real table times a complex array would be promoted to complex (twice the
    memory traffic on the largest array of the transform).
    """
    b = c.shape[0]
    parts = jnp.concatenate([c.real, c.imag])  # (2b, L, L)
    g = jnp.einsum("mlj,blm->bjm", table, parts)
    return g[:b] + 1j * g[b:]


def _legendre_project(table, g):
    """c[b, l, m] = sum_j table[m, l, j] g[b, j, m]: `_legendre_sum` transposed."""
    b = g.shape[0]
    parts = jnp.concatenate([g.real, g.imag])  # (2b, nlat, L)
    # As the batched matmul (m, l, j) @ (m, j, 2b): XLA:CPU ran the einsum
    # with output (2b, l, m) 6x slower (10 ms against 1.7 ms at L = 128).
    c = jnp.transpose(table @ jnp.transpose(parts, (2, 1, 0)), (2, 1, 0))
    return c[:b] + 1j * c[b:]


def _to_grid(grid: SphereGrid, g):
    """Grid values (b, nlat, nlon) of sum_m g[b, j, m] e^{i m phi} (+ conjugates)."""
    # Im g[..., 0] is dropped by irfft: the m = 0 term of a real function.
    pad = grid.nlon // 2 + 1 - grid.L
    g = jnp.pad(g, ((0, 0), (0, 0), (0, pad)))
    return grid.nlon * jnp.fft.irfft(g, n=grid.nlon, axis=-1)


def _from_grid(grid: SphereGrid, f):
    """Weighted longitude transform w_j (2 pi / nlon) sum_k f e^{-i m phi_k}, m < L."""
    g = jnp.fft.rfft(f, axis=-1)[..., : grid.L]
    scale = jnp.asarray(grid.lat_weights) * (2 * np.pi / grid.nlon)
    return g * scale[None, :, None]


def _batched(fn, x, core_ndim):
    """Apply fn (which maps a batch (b, ...)) to x with any leading shape."""
    x = jnp.asarray(x)
    lead = x.shape[: x.ndim - core_ndim]
    out = fn(x.reshape((-1,) + x.shape[x.ndim - core_ndim :]))
    return out.reshape(lead + out.shape[1:])


def _real_part_m0(c):
    """Coefficients of a real function: a_l0 real (rounding may leave Im ~ 1e-17)."""
    return c.at[..., 0].set(c[..., 0].real)


def analysis(
    grid: SphereGrid, f: Float[ArrayLike, "... nlat nlon"]
) -> Complex[Array, "... L L"]:
    """Coefficients a_lm = int f conj(Y_lm) by the grid's quadrature.

    The quadrature is exact for f of degree <= 2 nlat - L (>= 2L): the result
    is the orthogonal projection of f onto degrees < L, up to the aliasing of
    f's degrees beyond 2 nlat - L.

    Args:
        grid: the grid.
        f: real grid values, shape (..., nlat, nlon).

    Returns:
        Complex coefficients, shape (..., L, L), indexed [l, m] (m >= 0; 0 for
        m > l).
    """

    def fn(fb):
        return _real_part_m0(_legendre_project(grid.legendre, _from_grid(grid, fb)))

    return _batched(fn, f, 2)


def synthesis(
    grid: SphereGrid, coeffs: Complex[ArrayLike, "... L L"]
) -> Float[Array, "... nlat nlon"]:
    """Grid values of sum_lm a_lm Y_lm (a real function: m < 0 by symmetry).

    Args:
        grid: the grid.
        coeffs: complex coefficients, shape (..., L, L), indexed [l, m].

    Returns:
        Real grid values, shape (..., nlat, nlon).
    """

    def fn(cb):
        return _to_grid(grid, _legendre_sum(grid.legendre, cb))

    return _batched(fn, coeffs, 2)


def gradient(
    grid: SphereGrid, coeffs: Complex[ArrayLike, "... L L"]
) -> tuple[Float[Array, "... nlat nlon"], Float[Array, "... nlat nlon"]]:
    """The surface gradient of sum a_lm Y_lm in the frame (e_theta, e_phi).

    Args:
        grid: the grid.
        coeffs: complex coefficients, shape (..., L, L), indexed [l, m].

    Returns:
        (d_theta f, d_phi f / sin(theta)) at the nodes, shape (..., nlat, nlon)
        each.
    """
    im = 1j * jnp.asarray(orders(grid.L))[None]  # (1, 1, L)
    sin = jnp.asarray(grid.sin_theta)[None, :, None]

    def fn(cb):
        d_theta = _to_grid(grid, _legendre_sum(grid.legendre_dtheta, cb))
        d_phi = _to_grid(grid, _legendre_sum(grid.legendre, im * cb))
        return jnp.stack([d_theta, d_phi / sin], 1)

    out = _batched(fn, coeffs, 2)
    return out[..., 0, :, :], out[..., 1, :, :]


def weak_divergence(
    grid: SphereGrid,
    f_theta: Float[ArrayLike, "... nlat nlon"],
    f_phi: Float[ArrayLike, "... nlat nlon"],
) -> Complex[Array, "... L L"]:
    """Coefficients of div F in weak form: -int F . grad conj(Y_lm), by quadrature.

    Integration by parts on the closed sphere. Degree 0 is exactly 0 (grad Y_00 =
    0: its tables are zeros), so a transport rate built from it conserves mass
    to rounding whatever the quadrature's error. With conj(Y_lm) =
    Pbar_l^m e^{-i m phi}: div_lm = -A_dtheta(F_theta)_lm + i m A(F_phi / sin)_lm,
    A_T the analysis with the table T.

    Args:
        grid: the grid.
        f_theta: the field's e_theta component at the nodes, (..., nlat, nlon).
        f_phi: its e_phi component, same shape.

    Returns:
        Complex coefficients, shape (..., L, L), indexed [l, m].
    """
    im = 1j * jnp.asarray(orders(grid.L))[None]  # (1, 1, L)
    sin = jnp.asarray(grid.sin_theta)[None, :, None]

    def fn(fb):
        ft, fp = fb[:, 0], fb[:, 1] / sin
        a_t = _legendre_project(grid.legendre_dtheta, _from_grid(grid, ft))
        a_p = _legendre_project(grid.legendre, _from_grid(grid, fp))
        return _real_part_m0(-a_t + im * a_p)

    f_theta, f_phi = jnp.broadcast_arrays(jnp.asarray(f_theta), jnp.asarray(f_phi))
    return _batched(fn, jnp.stack([f_theta, f_phi], -3), 3)


def degree_energy(coeffs: Complex[ArrayLike, "... L L"]) -> Float[Array, "... L"]:
    """E_l = sum_{|m| <= l} |a_lm|^2 (Parseval: int f^2 = sum_l E_l), shape (..., L).

    Args:
        coeffs: complex coefficients, shape (..., L, L), indexed [l, m].

    Returns:
        The energy of each degree, shape (..., L).
    """
    c = jnp.abs(jnp.asarray(coeffs)) ** 2
    return c[..., 0] + 2 * jnp.sum(c[..., 1:], axis=-1)
