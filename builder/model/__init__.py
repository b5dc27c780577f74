"""The model and its variants in-process: loading the user's model and steps, the variant registry,
running a variant file, measuring it and ranking variants.

- source.py: the user's factory and weights as stage load reads them (``import_factory``)
- user_steps.py: the user's pre/post-processing steps at build time
- variants.py: the registry every stage registers its variants in (``register_variant``,
  ``resolve_variants``)
- runtime.py: ``open_runner(fmt, path)`` - run a model file in-process, the same way everywhere
- measure.py: measuring loops with perf_analyzer's stability rule; objective.py: the trade-off objective J
"""
