"""`python -m streamnccl` prints what this installation contains."""

import json

import streamnccl

print(json.dumps(streamnccl.info(), indent=2))
