"""SparkCheckpointJob manifests: validated locally as the API server would, then typed.

The CRD in ``crds/`` is the one source of truth. A manifest is checked against its
``openAPIV3Schema`` (translated to JSON Schema), defaulted like the API server defaults it,
and its CEL rules (``x-kubernetes-validations``) are evaluated with the
``common-expression-language`` package. Unlike the API server, which silently prunes unknown
fields, a local manifest with an unknown field is rejected, so a misspelt setting is never
silently ignored. Every problem is reported, each on one line naming the file and the field.

Otherwise the verdict is the API server's: patterns match as Go's RE2 does (``$`` is the end
of the text), integers are int64 (an integral float is stored as an integer), and a file
is bounded in size, nesting and alias expansion, so hostile YAML costs bounded time.

One module per job:

- ``crd``: the CRD (package data) and how to walk its schema;
- ``problems``: what is wrong with a manifest, one line per problem naming the field;
- ``defaults``: the API server's defaulting and integer storage;
- ``validation``: the schema and CEL rules, checked as the API server checks them;
- ``model``: the typed, validated manifest (``JobManifest``) and its construction;
- ``loading``: YAML files and text, bounded and strict, to a ``JobManifest``.
"""
