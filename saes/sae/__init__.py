"""SAE architectures behind one config and interface (see `saes.sae.base`)."""
