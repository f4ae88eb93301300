"""Worker protocol over WebSocket."""
