"""Small metric modules for the tests: good and bad custom functions, Evaluator subclasses.

Named in test configs by import path (``tests.metric_fixtures.good.sync_mean``); the
repository root is on ``sys.path`` in the tests and in CLI subprocesses (cwd).
"""
