"""Attribution graphs over a prompt (circuit-tracer's method, Ameisen et al. 2025, "Circuit
Tracing"; Marks et al. 2024, "Sparse Feature Circuits" for residual-stream SAEs):
`dictionaries` (which transcoders or SAEs form the nodes), `replacement` (the local
replacement model's forward passes), `targets` (logit nodes), `build` (the direct-effect
adjacency by batched backward passes), `graph` (the result), `prune` (influence, pruning,
scores), `perturb` (node values of the replacement model under perturbations), `supernodes`,
`interventions` and `export` (circuit-tracer's graph JSON)."""
