"""The on-disk atlas: layout, manifests, integrity, tables and FAISS indexes.

`store` knows files and arrays; it never runs a model and imports none of the other
packages.
"""
