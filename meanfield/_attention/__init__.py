"""Attention velocity fields Gamma_mu, one family per module."""
