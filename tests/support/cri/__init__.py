"""Python stubs of the Kubernetes CRI (k8s.io/cri-api runtime.v1, commit 791729b), generated
by ``CRI_API_PROTO=path/to/api.proto scripts/gen-protos.sh``: tests and bench/image start
pods through containerd's CRI as the kubelet does. Only tests use them, so they live here,
outside the package and its wheel. Their descriptor names its file
``bootseer/testing/cri/api.proto``, the name protoc was given; regenerating names it
``tests/support/cri/api.proto`` (a key in protobuf's pool that nothing imports by)."""
