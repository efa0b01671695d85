"""SAE evaluation pieces: streaming reconstruction / sparsity statistics and the
spliced-model CE / KL metrics. `saes.evaluate` puts them together."""
