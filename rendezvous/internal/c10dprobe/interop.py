"""Run under torchrun: PyTorch's own TCPStore and fairgo's c10d client share
torchrun's agent store.

    python3 -m torch.distributed.run --nproc-per-node 2 \
        rendezvous/internal/c10dprobe/interop.py /tmp/c10dprobe

Each rank sets "py/<rank>" through torch.distributed.TCPStore, runs the Go
probe (which reads it, and sets "go/<rank>"), then reads "go/<rank>".
"""
import os
import subprocess
import sys
from datetime import timedelta

import torch.distributed as dist

rank = int(os.environ["RANK"])
print(f"interop: rank {rank}: TORCHELASTIC_USE_AGENT_STORE={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')} "
      f"MASTER_ADDR={os.environ['MASTER_ADDR']} MASTER_PORT={os.environ['MASTER_PORT']}", flush=True)
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=timedelta(seconds=60))
store.set(f"py/{rank}", f"from python {rank}")
subprocess.run([sys.argv[1], "-py", "-mode", "c10d"] + sys.argv[2:], check=True)
value = store.get(f"go/{rank}").decode()
assert value == f"from go {rank}", value
print(f"interop: rank {rank} ok: Python's TCPStore read {value!r} that the Go client set", flush=True)
