"""The result types of the Atlas facade, each defined once: standard-library dataclasses
used from Python (with `to_dict()`, `_repr_html_()` and, where a picture helps, `.plot()`),
as the HTTP service's response models (their JSON schema is the OpenAPI schema) and by the
CLI's `--json`."""
