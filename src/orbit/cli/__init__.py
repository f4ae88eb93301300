"""Console scripts: `orbit` (server, dev) and `orbit-admin` (database administration)."""
