"""The server's routes, one module per concept."""
