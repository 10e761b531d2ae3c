"""The pipeline as plain functions: plan, infer, freeze, score, judge ledger, publish, and the one reuse authority."""
