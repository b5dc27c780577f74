"""The model spec: the YAML contract users write, as validated dataclasses, with errors that name the
file, the field and the fix.

- model.py: ``ModelSpec``, ``TensorSpec``, ``load_spec``, ``parse_spec`` (the spec itself)
- fields.py: reading one mapping of the YAML with errors that name the field
- checks.py: checks across fields (shapes in order, value ranges a dtype holds, generation rules)
- verify.py: the ``verify`` section (tolerances, task metric); compression.py: ``data.training`` and
  ``compression``; steps.py: ``preprocess`` / ``postprocess``; huggingface.py: ``source.huggingface``
"""
