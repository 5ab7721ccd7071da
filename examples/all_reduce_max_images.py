"""all_reduce with MAX: every rank holds a batch of images; all end with the pixel-wise
maximum over every rank's images (a max-projection)."""

import torch
import torch.distributed as dist
from _common import finish, start

rank, world_size, device = start()
generator = torch.Generator().manual_seed(rank)
images = torch.rand(4, 3, 16, 16, generator=generator).to(device)  # N, C, H, W

brightest = images.clone()
dist.all_reduce(brightest, op=dist.ReduceOp.MAX)

# Check against every rank's images, rebuilt from their seeds.
everyone = torch.stack([torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(r))
                        for r in range(world_size)])  # fmt: skip
ok = torch.equal(brightest.cpu(), everyone.amax(dim=0))
print(f"rank {rank}: mean pixel {images.mean():.3f} -> max-projection {brightest.mean():.3f}")
finish(ok, "all_reduce MAX over images")
