"""Load testing and measured tuning of a model served by Triton.

- ``loadtest.run_loadtest``: Locust (loadtest/locustfile.py) headless in a subprocess under a hard
  timeout; Locust's CSV/HTML reports plus ``summary.json`` with the server's own view (queue vs
  compute time per request, the batch sizes Triton formed).
- ``sweep.run_sweep``: closed-loop concurrency sweep (1, 2, 4, ... N) with an in-process client,
  each level measured until stable; CSV + latency-vs-throughput PNG.
- ``tune.run_tune``: searches dynamic batching, instance count and max_batch_size on the running
  server (model-control API, no restart) under a p99 budget; writes the winner back atomically.

Heavy imports (tritonclient, matplotlib) happen inside the functions that need them.
"""
