"""Every touch point with google-adk: agent loading, eval sets, test_config, inference, judge adapters, ADK history."""
