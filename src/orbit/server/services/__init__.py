"""One module per capability; each operation is `(tx, command) -> result`."""
