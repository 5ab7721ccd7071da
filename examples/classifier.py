"""A one-layer classifier trained on each rank's own data; gradients and the loss are
averaged across ranks with all_reduce (AVG), so every rank keeps the same weights."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
torch.manual_seed(0)  # the same initial weights everywhere
classifier = torch.nn.Linear(10, 3).to(device)
optimizer = torch.optim.SGD(classifier.parameters(), lr=0.5)
true_weights = torch.randn(10, 3, generator=torch.Generator().manual_seed(7)).to(device)
data = torch.Generator().manual_seed(100 + rank)  # each rank its own samples

for step in range(30):
    x = torch.randn(64, 10, generator=data).to(device)
    labels = (x @ true_weights).argmax(dim=1)
    loss = torch.nn.functional.cross_entropy(classifier(x), labels)
    optimizer.zero_grad()
    loss.backward()
    for parameter in classifier.parameters():
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.AVG)
    optimizer.step()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
    if step == 0:
        first_loss = mean_loss.item()
    if rank == 0 and step % 10 == 9:
        print(f"step {step + 1}: loss over all ranks {mean_loss.item():.4f}", flush=True)

weights = torch.cat([p.detach().reshape(-1) for p in classifier.parameters()])
everyone = [torch.empty_like(weights) for _ in range(world_size)]
dist.all_gather(everyone, weights)
same = all(torch.equal(w, everyone[0]) for w in everyone)
finish(same and mean_loss.item() < first_loss, "classifier: same weights, loss went down")
