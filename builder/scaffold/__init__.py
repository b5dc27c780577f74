"""`triton-builder init`: a commented spec.yaml drafted from a model, for the user to review and build.

- init.py: ``init_spec`` - the verb: which draft, then write and check it
- draft.py: the draft (``Draft``, ``Tensor``, ``Value``), its rendering and the ONNX draft
- torch_sources.py: drafts for a TorchScript file or a Python factory
- huggingface.py: the draft for a Hugging Face folder
"""
