"""A tiny CPU training job for the zero-code capture test: gloo process group, a checkpoint
saved and loaded with torch.save/torch.load and torch.distributed.checkpoint, three steps.
Written to know nothing about bootseer."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(out, "model.pt"))
dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, "dcp"))
dist.barrier()
model.load_state_dict(torch.load(os.path.join(out, "model.pt")))
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=os.path.join(out, "dcp"))
for _ in range(3):
    opt.zero_grad()
    loss = model(torch.ones(4, 16)).sum()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
