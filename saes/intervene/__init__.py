"""Running the model on prompts with activations changed: the concept/prompt layer
(`concepts`), patched forwards and answer metrics (`answers`), SAEs spliced in with their
error term (`splice`), typed feature edits (`edits`), seeded generation with the
next-token shift (`generate`), incremental KV-cached decoding of a batch (`decode`) and activation x gradient attribution (`attribution`).
Geometry analyses and the feature-intervention tools share it."""
