"""SAE evaluation, the one home for it: `reconstruction` (streaming reconstruction /
sparsity statistics), `downstream` (CE / KL with the SAE spliced into the model),
`evaluate` (both over an atlas's held-out split, written to `eval.json`) and `stream`
(the same over tokens streamed through the model).

The suite (`suite`: registry and resumable runner; `spec`: what an eval declares;
`results`: SAEBench-layout results in `saes/<id>/evals/<eval>.json` with checksummed
sidecars) runs one module per eval: `core`, `sparse_probing` (sets from `probe_data`),
`meta`, `mdl` and `ground_truth`."""
