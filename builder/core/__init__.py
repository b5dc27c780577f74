"""Plumbing every other folder stands on; it imports nothing from the rest of builder/.

- errors.py: BuilderError > UserInputError (exit 2) | VerificationError (exit 1) | ServerError (exit 2), and
  ``names_parameters`` (the API's errors name its parameters, not the CLI's flags)
- progress.py: the one progress reporter (the library never prints): ``Reporter``, ``bar``
- interrupts.py: SIGINT/SIGTERM for foreground loops: ``stop_signals``, ``terminate_as_interrupt``
- processes.py: the ONE base for every process we start (``LocalService``) and ``run_command``
- ports.py: free ports, whether a port can be bound and why not
- files.py: hashes and small file helpers; scratch.py: scratch folders owned by a live process
- host.py: the host profile (CPU, ISA, cores, GPU), how hosts differ, serving sized to a host;
  local_server.py: the cores a local server may use
- side_env.py: what is installed once into the cache (side virtualenvs, tools); extras.py: optional
  dependencies with an error naming the extra; assets.py: where templates/, loadtest/, monitoring/ are
"""
