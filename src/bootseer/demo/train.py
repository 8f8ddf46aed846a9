"""The demo's training job: a small transformer language model on random tokens.

``--init DIR`` trains a few steps and saves a torch.distributed.checkpoint (DCP) to DIR.
Otherwise it resumes from ``$BOOTSEER_CKPT_DIR``, runs one optimizer step, and signals
that the job is ready by touching ``$BOOTSEER_READY_FILE`` (what ``bootseer run`` waits
for to close the hot-block recording window). Imports of the requirements set prove the
environment restored correctly. Runs on torch CPU; no bootseer import needed in the image.
"""

import argparse
import os
import time
import warnings

T0 = time.time()
# Single-process DCP save/load warns that no process group exists: expected here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True)
        self.body = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)))


def build(args):
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.layers)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optim


def step(model, optim, args):
    tokens = torch.randint(0, args.vocab, (2, 32))
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
    optim.zero_grad()
    loss.backward()
    optim.step()
    return float(loss.detach())


def state_of(model, optim):
    # Materialise the optimizer state so the checkpoint holds it (as a real resume does).
    return {"model": model.state_dict(), "optim": optim.state_dict()}


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
    model, optim = build(args)
    if args.init:
        for _ in range(args.steps):
            step(model, optim, args)
        dcp.save(state_of(model, optim), checkpoint_id=args.init)
        print(f"saved checkpoint to {args.init}")
        return
    step(model, optim, args)  # creates optimizer state tensors to load into
    state = state_of(model, optim)
    t = time.time()
    dcp.load(state, checkpoint_id=os.environ["BOOTSEER_CKPT_DIR"])
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    load_s = time.time() - t
    loss = step(model, optim, args)
    ready = os.environ.get("BOOTSEER_READY_FILE")
    if ready:
        with open(ready, "w") as f:
            f.write(f"{time.time()}\n")
    print(f"ready: resumed, loss={loss:.3f}, ckpt load {load_s:.1f}s, "
          f"process {time.time() - T0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
