"""Where a training process runs: its rank among torchrun's processes, its device,
and the model as DDP trains it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup_distributed(device: str) -> tuple[int, int, int]:
    """(rank, world_size, local_rank); under torchrun, joins the process group (NCCL on
    GPUs, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, 0
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return rank, world_size, local_rank


def training_device(device: str, local_rank: int = 0) -> torch.device:
    """The device a rank trains on ("auto": its GPU when there is one), with TF32 on for
    CUDA."""
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul left
        torch.backends.cudnn.allow_tf32 = True
    return device


def on_main_rank(check, rank: int, world_size: int) -> None:
    """Run `check` on the main rank (0) only; under DDP every rank then raises its
    OSError or ValueError, if any, so that all stop together."""
    error = None
    if rank == 0:
        try:
            check()
        except (OSError, ValueError) as e:
            error = e
    if world_size > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise error


def wrap_for_training(
    model, device: torch.device, local_rank: int, world_size: int, compile: bool
):
    """(ddp, train_model, eval_model): training runs through DDP (None for one
    process) and compile when used; eval through the compiled model; generation through
    the plain model, whose KV-cache steps would only recompile."""
    ddp = None
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = device.type == "cuda"
        ddp = DistributedDataParallel(
            model, device_ids=[local_rank] if on_gpu else None
        )
    eval_model = torch.compile(model) if compile else model
    if ddp is None:
        return None, eval_model, eval_model
    return ddp, torch.compile(ddp) if compile else ddp, eval_model
