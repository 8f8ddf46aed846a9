"""The demo's training job: a small transformer language model on random tokens, trained
with FSDP2 (``fully_shard``) over gloo on CPU by every rank of a ``torchrun`` job.

``--init DIR`` (under ``torchrun --nproc-per-node N``) trains a few steps and saves a
sharded torch.distributed.checkpoint (DCP) to DIR: one file per rank, written by that rank.
Otherwise each rank joins the job, resumes from ``$BOOTSEER_CKPT_DIR`` reading only its own
shard, takes one optimizer step (whose gradients are reduced across ranks, then the loss
all-reduced), and signals that the job is ready: ``bootseer.ready()`` where bootseer is
importable, else by creating ``$BOOTSEER_READY_FILE``. Imports of the requirements set prove
the environment restored correctly. Needs nothing from bootseer in the image.
"""

import argparse
import os
import time
import warnings
from typing import Any

T0 = time.time()
warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True)
        self.body = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)))


def build(args):
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.layers)
    for layer in model.body.layers:
        fully_shard(layer)
    fully_shard(model)   # every parameter is now a DTensor sharded across the ranks
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optim


def step(model, optim, args) -> float:
    """One optimizer step; the loss is all-reduced (the job's first all-reduce on resume)."""
    g = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, args.vocab, (2, 32), generator=g)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
    optim.zero_grad()
    loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    optim.step()
    return float(mean) / dist.get_world_size()


def signal_ready() -> None:
    try:
        import bootseer
        ready = getattr(bootseer, "ready", None)
    except ImportError:
        ready = None
    if ready is not None:
        ready()
        return
    path = os.environ.get("BOOTSEER_READY_FILE")
    if path:
        with open(path, "w") as f:
            f.write(f"{time.time()}\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--init", metavar="DIR")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--imports", default=os.environ.get("DEMO_IMPORTS", ""))
    args = p.parse_args()
    for name in filter(None, args.imports.split(",")):
        __import__(name)
    t = time.time()
    dist.init_process_group("gloo")   # joins every rank: waits for the slowest node
    joined_s = time.time() - t
    rank = dist.get_rank()
    model, optim = build(args)
    if args.init:
        for _ in range(args.steps):
            step(model, optim, args)
        model_state, optim_state = get_state_dict(model, optim)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.init)
        if rank == 0:
            print(f"saved a checkpoint of {dist.get_world_size()} shards to {args.init}")
        leave()
        return
    model_state, optim_state = get_state_dict(model, optim)   # allocates optimizer state
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    t = time.time()
    dcp.load(state, checkpoint_id=os.environ["BOOTSEER_CKPT_DIR"])   # this rank's shard
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    load_s = time.time() - t
    loss = step(model, optim, args)
    signal_ready()
    print(f"ready: rank {rank}/{dist.get_world_size()} resumed, loss={loss:.3f}, "
          f"joined in {joined_s:.1f}s, shard load {load_s:.1f}s, "
          f"process {time.time() - T0:.1f}s", flush=True)
    leave()


def leave():
    """Leave the group only once every rank is done with it: gloo aborts a rank (SIGABRT at
    teardown) whose peer closed its connections while it still held them."""
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
