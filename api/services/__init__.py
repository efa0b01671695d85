"""The facade's services, one module per job. Each takes an `api.context.AtlasContext`
and `api.sae_view.SaeView`s, never the `Atlas` itself."""
