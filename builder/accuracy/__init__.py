"""What a variant is judged on and how: generated cases that are inputs the model could get, the
equivalence metrics and tolerances, task metrics, the user's data checked against the model.

- verification.py: ``verify_variant`` - one variant against the reference (stage verify, and a derived
  variant's base first: stages/common.py check_base)
- tensors.py: dtypes, generated inputs and cases, ``compare_outputs`` and the metrics
- input_rules.py: the rule that makes each input's values (spec, data, transformers names)
- task_metrics.py: label / embedding metrics for outputs judged by the task
- data_checks.py: data.validation / data.calibration / data.training against the model
"""
