"""Each operation's parameters, defined once (`base.Operation`): the `Atlas` method validates
with them, the HTTP request bodies are them, the CLI verbs take the same names and defaults;
`registry` lists the operations and the ones not converted yet."""
