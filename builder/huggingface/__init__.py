"""Hugging Face sources: a save_pretrained folder served text in, labels (or embeddings) out.

- folder.py: what the folder says (task registry, labels, limits, pooling), read without torch
- module.py: the model step as a torch module (pooling in the graph for feature-extraction)
- texts.py: the texts verified on (data.validation or generated), tokenized by the served step's code
- reference.py: transformers' pipeline / sentence-transformers on those texts, and the comparison
- source.py: stage load's entry point
- label_head.py: a classifier's post-processing folded into its ONNX graph (stage publish)
- ragged.py: the model step's ONNX graph taking ragged batches, so texts of any length batch (stage publish)
- step_timing.py: the steps' own code timed in-process for the build report (stage benchmark)

The python steps are templates/pipeline/; the ensemble and its steps are published by
builder/repository/pipeline.py.
"""
