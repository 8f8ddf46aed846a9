"""Start a pod the way the kubelet does, through containerd's CRI gRPC API: pull the
image, run a sandbox on the node's network, create and start one container, wait for it
to exit, read its log. Used by the snapshotter's tests and bench/image."""

from __future__ import annotations

import os
import time
import uuid

import grpc

from tests.support.cri import api_pb2 as cri
from tests.support.cri import api_pb2_grpc


class CriClient:
    def __init__(self, socket: str):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def pull(self, image: str) -> str:
        return self.images.PullImage(cri.PullImageRequest(
            image=cri.ImageSpec(image=image)), timeout=300).image_ref

    def run(self, image: str, argv: list[str], log_dir: str, *, env: dict | None = None,
            timeout: float = 120.0) -> tuple[int, str]:
        """Run ``argv`` in ``image`` as a pod's only container (host network); return
        (exit code, its log's lines without the CRI prefix). The pod is removed after."""
        name = f"p{uuid.uuid4().hex[:8]}"
        os.makedirs(log_dir, exist_ok=True)
        sandbox = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=name, namespace="default"),
            log_directory=log_dir,   # no hostname: the node's network (and UTS)
            linux=cri.LinuxPodSandboxConfig(security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NODE))))
        pod = self.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=sandbox),
                                         timeout=120).pod_sandbox_id
        try:
            config = cri.ContainerConfig(
                metadata=cri.ContainerMetadata(name="job"), image=cri.ImageSpec(image=image),
                command=argv[:1], args=argv[1:], log_path="job.log",
                envs=[cri.KeyValue(key=k, value=v.encode())   # bytes in the newest cri-api
                      for k, v in (env or {}).items()])
            cid = self.runtime.CreateContainer(cri.CreateContainerRequest(
                pod_sandbox_id=pod, config=config, sandbox_config=sandbox),
                timeout=120).container_id
            self.runtime.StartContainer(cri.StartContainerRequest(container_id=cid),
                                        timeout=120)
            deadline = time.monotonic() + timeout
            while True:
                st = self.runtime.ContainerStatus(
                    cri.ContainerStatusRequest(container_id=cid), timeout=30).status
                if st.state == cri.CONTAINER_EXITED:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"container of pod {name} still running after {timeout} s")
                time.sleep(0.1)
            return st.exit_code, _log_lines(os.path.join(log_dir, "job.log"))
        finally:
            self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
            self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod),
                                          timeout=60)


def _log_lines(path: str) -> list[str]:
    """CRI log lines are ``TIME STREAM TAG TEXT``."""
    try:
        with open(path) as f:
            return [line.rstrip("\n").split(" ", 3)[3] for line in f if line.count(" ") >= 3]
    except FileNotFoundError:
        return []
