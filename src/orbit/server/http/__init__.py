"""HTTP protocol layer: one module per resource, plus the shared request plumbing."""
