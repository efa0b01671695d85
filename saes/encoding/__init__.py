"""Running SAE encoders over activations, one module per kind of input: cached
activations (`cached`), whole texts pooled over their tokens (`texts`), a concept's
prompts at the concept token (`concepts`) and one text token by token (`tokens`)."""
