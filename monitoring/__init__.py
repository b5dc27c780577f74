"""Monitoring for triton-builder deployments: the batch-size exporter, Prometheus and Grafana config."""
