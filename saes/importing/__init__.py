"""Import a pretrained SAE into an atlas: where it comes from (`sources`), the activations
that judge it (`activations`), the misload guard (`guard`) and the pipeline that converts,
judges and registers it (`pipeline.import_sae`)."""
