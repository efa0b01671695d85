"""SAE evaluation, the one home for it: `reconstruction` (streaming reconstruction /
sparsity statistics), `downstream` (CE / KL with the SAE spliced into the model) and
`evaluate` (both over an atlas's held-out split, written to `eval.json`)."""
