"""Load testing and measured tuning of a model served by Triton.

- ``loadtest.run_loadtest``: Locust (loadtest/locustfile.py) headless in a subprocess under a hard
  timeout; Locust's CSV/HTML reports plus ``summary.json`` with the server's own view (queue vs
  compute time per request, the batch sizes Triton formed).
- ``sweep.run_sweep``: closed-loop concurrency sweep (1, 2, 4, ... N), each level measured until
  stable by the engine (``engine.py``: Triton's perf_analyzer - ``perf_analyzer.py`` installs it,
  ``pa_measure.py`` runs it - or the in-process Python client, ``client.py``); CSV + PNG.
- ``tune.run_tune``: searches dynamic batching, instance count, intra-op threads and max_batch_size
  (measured by the same engine) on the running server (model-control API, no restart) under a p99
  budget; writes the winner back atomically.

Heavy imports (tritonclient, matplotlib) happen inside the functions that need them.
"""
