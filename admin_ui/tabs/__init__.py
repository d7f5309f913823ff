"""The console's tabs, one module each."""
