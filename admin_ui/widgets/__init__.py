"""Reusable widgets and delegates of the console."""
