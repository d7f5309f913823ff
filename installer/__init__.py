"""The installer's Python side: where an install keeps its files (paths.py, beside paths.sh)."""
