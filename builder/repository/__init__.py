"""The model repository: its layout, version numbers and the ONLY writer into it (atomic publish of a
typed version description), config model -> text -> Triton's schema, metadata, signing, validate
(replay, regression, runtime gate), rollout and rollback records, tuned configs, re-selection.
"""
