"""Dependency snapshots: resolve once, build once per key (one builder across all nodes),
snapshot into the tree format, restore everywhere."""
