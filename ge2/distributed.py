"""``ge2.distributed``: the process group of a data-parallel run, thin over ``torch.distributed``.

ge2 adds no transport: the collectives are NCCL's on GPUs and gloo's on CPUs, and the processes are
started by torch's launcher (``torchrun --nproc-per-node N -m ge2 train ...`` or ``ge2 train --nproc N``,
which calls the same launcher). ``init_process_group()`` reads the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) unless given explicit arguments, picks
NCCL when CUDA is present and gloo otherwise, and on a GPU binds the process to GPU ``LOCAL_RANK``.
The group's ``timeout`` bounds how long a collective waits for a rank that died or raised: the
survivors then fail with an error instead of hanging.
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)


def is_available() -> bool:
    """Whether this torch build has torch.distributed."""
    return dist.is_available()


def is_initialized() -> bool:
    """Whether a process group is set up in this process."""
    return dist.is_available() and dist.is_initialized()


def default_backend() -> str:
    """"nccl" where CUDA is present, else "gloo"."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(backend: str | None = None, *, init_method: str | None = None, rank: int | None = None,
                       world_size: int | None = None, timeout: datetime.timedelta | float | None = None) -> None:
    """Join the process group: from the torchrun environment, or the explicit ``rank``/``world_size`` and
    ``init_method`` (e.g. "tcp://127.0.0.1:29500"). ``timeout`` (seconds or a timedelta) bounds every
    collective's wait for the other ranks."""
    if is_initialized():
        raise RuntimeError("init_process_group: a process group is already initialized in this process")
    backend = backend or default_backend()
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"init_process_group: backend must be 'nccl' or 'gloo', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("init_process_group: backend 'nccl' needs CUDA GPUs; use 'gloo' on CPUs")
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is outside [0, world_size={world_size})")
    kwargs: dict = {}
    if init_method is None and ("MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ):
        if world_size != 1:
            raise ValueError("init_process_group: no MASTER_ADDR/MASTER_PORT in the environment (start the ranks "
                             "with torchrun or ge2 train --nproc) and no init_method given")
        kwargs["store"] = dist.HashStore()  # a lone process needs no rendezvous
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if backend == "nccl":
        device = torch.device("cuda", get_local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # creates the communicator now, for this GPU
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout,
                            **kwargs)


def destroy_process_group() -> None:
    """Leave the process group (a no-op when none is initialized)."""
    if is_initialized():
        dist.destroy_process_group()


def get_rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    """How many processes the group has (1 without a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def get_local_rank() -> int:
    """This process's index on its host (torchrun's LOCAL_RANK; the GPU it uses)."""
    return int(os.environ.get("LOCAL_RANK", get_rank() if is_initialized() else 0))


def is_main_process() -> bool:
    """Rank 0: the one process that prints, logs and writes checkpoints."""
    return get_rank() == 0


def barrier() -> None:
    """Wait until every rank reaches this point (a no-op without a process group)."""
    if is_initialized():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def device() -> torch.device:
    """The device this rank computes on: its GPU under NCCL, else the CPU."""
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# ---- helpers of ge2 train's data parallelism ----------------------------------------------------
def wrap(model, **kwargs):
    """``DistributedDataParallel(model, **kwargs)`` when the group has several ranks, else ``model``."""
    if get_world_size() == 1:
        return model
    from ge2.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, **kwargs)


def shard(batch):
    """This rank's contiguous share of a global batch's rows (a view): every rank draws the same global
    batch, so a run's data does not depend on the world size and a checkpoint resumes on any."""
    world = get_world_size()
    if world == 1:
        return batch
    n = batch.shape[0]
    if n % world:
        raise ValueError(f"ge2 train: the batch size {n} is not a multiple of the {world} ranks")
    rank = get_rank()
    return batch[rank * (n // world):(rank + 1) * (n // world)]


# ---- ge2 train --nproc N ------------------------------------------------------------------------
def launched_by_torchrun() -> bool:
    """Whether this process is a rank started by torch's launcher (it sets WORLD_SIZE and RANK)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ and "LOCAL_RANK" in os.environ


def spawn(nproc: int, module_args: list[str]) -> int:
    """``torchrun --standalone --nproc-per-node nproc -m <module_args>`` through torch's elastic launcher,
    in this process; returns 0, or 1 after printing which rank failed and why (the launcher has already
    stopped the other ranks)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc}: this machine has {torch.cuda.device_count()} GPU(s), one rank per GPU")
    args = get_args_parser().parse_args(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0",
                                         "--monitor-interval", "0.5", "-m", *module_args])
    try:
        run(args)
    except ChildFailedError as e:
        failures = "; ".join(f"rank {rank} exited with code {f.exitcode}" + (f" ({f.message})" if f.message else "")
                             for rank, f in e.failures.items())
        print(f"ge2: a rank failed, the others were stopped: {failures}", file=sys.stderr)
        return 1
    return 0
