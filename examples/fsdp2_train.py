"""Sharded data-parallel training (FSDP2) with one compile: precompile on rank 0, load everywhere.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py [--steps 5] [--backend inductor]

The model is sharded with ``torch.distributed.fsdp.fully_shard`` as usual (each
layer, then the root): every parameter is a DTensor holding this rank's
shard.  The whole iteration -- forward, backward and the AdamW step -- is
precompiled on rank 0 into one artifact, which every rank loads from the pair
rank 0 broadcasts.  What fully_shard does is part of the graph: it all-gathers
each parameter from its shards, and backward reduce-scatters the gradients, so
each rank's ``.grad`` is the DTensor shard of the average that eager FSDP2
leaves, and the optimizer steps the local shards (its state DTensors, as
eager's).  The artifact holds no weights and bakes no rank; capture runs no
collective, so rank 0 precompiles alone while the others wait.

Each rank trains an identically sharded copy eagerly too, and the script
checks that both give the same losses and parameter shards.  Loading a
broadcast artifact executes it: only broadcast pairs from a rank you trust.
"""

import argparse
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch_precompile
from torch.distributed.fsdp import fully_shard


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank, then sharded
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # .grad: this rank's shard of the averaged gradient, a DTensor
    opt.step()
    opt.zero_grad()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backend", default="inductor", choices=("inductor", "eager"))
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)  # each rank its own batches
    batches = [(torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)) for _ in range(args.steps)]

    model, eager_model = make_model(), make_model()
    opt, eager_opt = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.optim.AdamW(eager_model.parameters(), lr=1e-3)
    pair = [torch_precompile.precompile(train_step, model, opt, *batches[0], backend=args.backend) if rank == 0 else None]
    dist.broadcast_object_list(pair, src=0)  # unpickles: only from ranks you trust
    step = torch_precompile.load(*pair[0])

    for i, (x, y) in enumerate(batches):
        loss = step(model, opt, x, y)  # all-gather, forward, backward, reduce-scatter, AdamW: one call
        torch.testing.assert_close(loss, train_step(eager_model, eager_opt, x, y))
        print(f"rank {rank} step {i}: loss {loss.item():.4f}")
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.to_local(), q.to_local())
    print(f"rank {rank}: parameter shards equal eager FSDP2's after {args.steps} steps")
    dist.barrier()  # no rank tears down gloo's connections while a peer still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
