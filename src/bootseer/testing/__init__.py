"""Helpers shipped with the package for tests, benchmarks and the demo: real servers on
loopback (nginx, docker-registry, containerd), shaped links in network namespaces, and the
unit tier's fakes (a memory backend, a failing backend, a fake clock)."""
