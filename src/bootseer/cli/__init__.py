"""Command line: argument parsing only. Each module here adds one command group."""
