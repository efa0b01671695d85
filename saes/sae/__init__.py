"""SAE architectures behind one config and interface (see `saes.sae.base`).

Importing the package registers the built-in architectures (`saes.sae.architectures`), so an
`SAEConfig` naming one is valid wherever `saes.sae` is used.
"""

from sae_atlas.saes.sae import architectures as _builtin_architectures  # noqa: F401
