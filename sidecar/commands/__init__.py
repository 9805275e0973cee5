"""One module per CLI command: parse its arguments, call the app or an adapter, render."""
