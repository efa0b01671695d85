"""Streaming feature summaries: per-latent statistics, top and band examples, logit effects.

Every accumulator holds state of size O(d_sae * k * window) independent of the number of
tokens seen; `saes.summary.run` drives them over a hook's held-out blocks.
"""
