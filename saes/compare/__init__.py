"""Comparing two dictionaries: streamed activation correlations between two SAEs
(`correlation`, `pairs`), token alignment across tokenizers (`align`), the comparison of
two SAEs (`saes_pair`) and crosscoders on paired activations (`crosscoder`)."""
