"""Load shapes for loadtest/locustfile.py, chosen with ``--load-shape constant|ramp|steps``.

All three read the usual ``--users``, ``--spawn-rate`` and ``--run-time`` (``use_common_options``),
and stop the test when ``--run-time`` has passed (or when the locustfile ends the run early):

- ``constant``: ``--users`` users (started at ``--spawn-rate`` per second) for the whole run.
- ``ramp``: from 1 user up to ``--users``, linearly over ``--run-time``: the point where p99 bends
  upwards is the server's knee (see the ``*_stats_history.csv`` report).
- ``steps``: ``--load-steps`` equal steps (default 4) up to ``--users``, each held for an equal
  share of ``--run-time``: a plateau per level, so each level's numbers settle.

The shape runs on the master in distributed mode; workers only run users.
"""

from __future__ import annotations

import math

from locust import LoadTestShape

SHAPES = ("constant", "ramp", "steps")


class TritonLoadShape(LoadTestShape):
    use_common_options = True  # read --users/--spawn-rate/--run-time instead of ignoring them

    def tick(self):
        options = self.runner.environment.parsed_options
        users = max(1, int(options.num_users or 1))
        spawn_rate = float(options.spawn_rate or users)
        run_time = options.run_time
        elapsed = self.get_run_time()
        if run_time and elapsed >= run_time:
            return None  # the test ends here; in-flight requests finish within --stop-timeout
        if getattr(self.runner.environment, "triton_stop_reason", None):
            return None  # the locustfile ended the run early (an unreachable server), same stop path
        shape = getattr(options, "load_shape", "constant") or "constant"
        if shape == "constant" or not run_time:
            return users, spawn_rate
        if shape == "ramp":
            target = max(1, math.ceil(users * elapsed / run_time))
            return min(users, target), max(spawn_rate, float(users))
        steps = max(1, int(getattr(options, "load_steps", 4) or 4))
        step = min(steps, int(elapsed / (run_time / steps)) + 1)
        return max(1, math.ceil(users * step / steps)), max(spawn_rate, float(users))
