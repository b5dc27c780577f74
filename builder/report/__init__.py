"""The build report, made from the pipeline's records only.

- build_report.py: ``format_table``, ``variant_rows``, the report files
- compression.py: the compression view (size, FLOPs, speed, accuracy; the Pareto front)
"""
