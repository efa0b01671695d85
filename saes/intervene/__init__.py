"""Running the model on prompts with activations changed: the concept/prompt layer
(`concepts`), patched forwards and answer metrics (`answers`). Geometry analyses and the
feature-intervention tools share it."""
