"""The Orbit Python SDK: HTTP clients, the worker runtime and the raw worker session."""
