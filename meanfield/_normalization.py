"""Where the LayerNorm sits: the normalisation schemes of the token dynamics.

Each scheme is the continuous-time limit of a residual block
(docs/math/particles.md).
With θᵢ = xᵢ / |xᵢ|, ν = Σⱼ wⱼ δ_{θⱼ} the measure of directions and Γ_ν the
attention field of ν:

    None       xᵢ' = Γ_μ(xᵢ)                         x + h Attn(x)
    "sphere"   θᵢ' = P⊥_{θᵢ} Γ_ν(θᵢ)                 Norm(x + h Attn(x)), post-LN
    "pre-ln"   xᵢ' = Γ_ν(θᵢ)                         x + h Attn(Norm(x))
    "peri-ln"  xᵢ' = Γ_ν(θᵢ) / |Γ_ν(θᵢ)|             x + h Norm(Attn(Norm(x)))
    "ngpt"     θᵢ' = α P⊥_{θᵢ} Γ_ν(θᵢ) / |Γ_ν(θᵢ)|   Norm(x + α h (Norm(Attn(x)) − x))

with P⊥_θ v = v − ⟨θ, v⟩θ. "sphere" and "ngpt" keep the tokens on the sphere;
"pre-ln" and "peri-ln" leave the residual stream free (the radii grow, the
angular speed is divided by |xᵢ|). A zero output Γ = 0 has no direction: the
normalised schemes give it velocity 0 there.
"""

import equinox as eqx
import jax.numpy as jnp

from ._linalg import last_axis_sum, row_norms

NORMALIZATIONS = (None, "sphere", "pre-ln", "peri-ln", "ngpt")
#: Schemes whose tokens stay on the unit sphere.
ON_SPHERE = ("sphere", "ngpt")


def needs_directions(normalization) -> bool:
    """Whether the scheme uses θ = x / |x| (a zero token is then an error)."""
    return normalization is not None


def _unit(v):
    """Rows of v divided by their norms, 0 where v = 0."""
    norms = row_norms(v, keepdims=True)
    return jnp.where(norms > 0, v / jnp.where(norms > 0, norms, 1), 0)


def _project(theta, v):
    return v - last_axis_sum(theta * v, keepdims=True) * theta


def velocity(attn, measure, x, t, normalization, alpha):
    """(dx/dt (n, d), converged) at tokens x (n, d) under the scheme.

    `measure` supplies the weights and positions; its x is replaced by x (or by
    the directions θ for every scheme but None).
    """
    if normalization is not None:
        # Evaluated on the directions: for the sphere schemes radial round-off
        # in x never feeds back (projection method).
        x = x / row_norms(x, keepdims=True)
    mu = eqx.tree_at(lambda m: m.x, measure, x)
    if normalization == "sphere":
        # From differences where the family can (relative precision at large
        # beta); else the projection of the field.
        tangent = attn.sphere_velocity(mu, t=t)
        if tangent is not None:
            return tangent.astype(x.dtype), jnp.array(True)
    vel, ok = attn.velocity_and_status(mu, t=t)
    if normalization == "sphere":
        vel = _project(x, vel)
    elif normalization == "peri-ln":
        vel = _unit(vel)
    elif normalization == "ngpt":
        vel = alpha * _project(x, _unit(vel))
    return vel, ok


def layer(attn, measure, x, t, h, normalization, alpha):
    """(x after one residual block of depth h, converged).

    The Euler step of `velocity`, except "ngpt", whose block interpolates towards
    the normalised output and renormalises (its limit is `velocity`'s).
    """
    if normalization == "ngpt":
        theta = x / row_norms(x, keepdims=True)
        mu = eqx.tree_at(lambda m: m.x, measure, theta)
        out, ok = attn.velocity_and_status(mu, t=t)
        step = theta + alpha * h * (_unit(out) - theta)
        return step / row_norms(step, keepdims=True), ok
    vel, ok = velocity(attn, measure, x, t, normalization, alpha)
    x_new = x + h * vel
    if normalization == "sphere":
        x_new = x_new / row_norms(x_new, keepdims=True)
    return x_new, ok
