"""Read-only views of records: summary, show, explain, diff, replay, verify, Prefect artifacts."""
