"""Transcoders: SAEs (`saes.sae.base`) that read one hook and predict another, e.g. an MLP's
output from its input; their paired training rows, evaluation with the MLP replaced, and
importers for transcoder formats."""
