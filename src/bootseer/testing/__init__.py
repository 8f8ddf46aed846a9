"""Helpers shipped with the package for tests and benchmarks: real servers on loopback
(nginx, docker-registry) and shaped links in network namespaces."""
