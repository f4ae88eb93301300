"""Worker protocol over WebSocket (`workers.md`)."""
