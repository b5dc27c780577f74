"""Serving: start and talk to Triton servers (``builder.serving.embedded`` runs one without docker)."""
