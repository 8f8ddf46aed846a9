"""Test-only code that is not part of the package (never in the wheel): the CRI client the
snapshotter's tests and bench/image start pods with."""
