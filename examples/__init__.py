"""Offline demo for evalsnap: a scripted ADK agent, an offline judge and an eval set."""
