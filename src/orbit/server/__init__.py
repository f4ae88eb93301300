"""The Orbit server: HTTP/WebSocket protocol, services and storage.

Only server code imports from here; the SDK (`import orbit`) never does.
"""
