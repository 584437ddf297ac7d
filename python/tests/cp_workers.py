"""Processes joined in one torch.distributed group, kept alive across tests (test_distributed.py):
starting a process that imports torch and fusedattn takes seconds, a case takes milliseconds.

ProcessGroupPool(world, backend) spawns `world` processes (gloo on the CPU, or nccl with one GPU
each); pool.run(case) hands the same case to every rank and returns each rank's result. A case is
a dict of NumPy arrays and plain values (see run_case), so that nothing but data crosses the
process boundary.
"""

import os
import queue
import socket
import traceback

import numpy as np

# NVLink multicast stays off on the GPU machines (their device notes): NCCL, PyTorch, NVSHMEM.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessGroupPool:
    def __init__(self, world, backend="gloo", device="cpu"):
        import torch.multiprocessing as mp
        context = mp.get_context("spawn")
        port = _free_port()
        self.world = world
        self.tasks = [context.Queue() for _ in range(world)]
        self.results = context.Queue()
        self.processes = [context.Process(target=_serve, daemon=True, args=(
            rank, world, port, backend, device, self.tasks[rank], self.results))
            for rank in range(world)]
        for p in self.processes:
            p.start()

    def run(self, case, timeout=300):
        """[(status, payload)] per rank: ("ok", {name: array}) or ("error", (type name,
        message, traceback)). Raises TimeoutError (and closes the pool) when a rank does not
        answer in time, e.g. a collective that some rank never joined."""
        for tasks in self.tasks:
            tasks.put(case)
        answers = [None] * self.world
        for _ in range(self.world):
            try:
                rank, status, payload = self.results.get(timeout=timeout)
            except queue.Empty:
                self.close()
                raise TimeoutError("a rank did not answer within %d s (answers: %s)"
                                   % (timeout, answers)) from None
            answers[rank] = (status, payload)
        return answers

    def alive(self):
        return all(p.is_alive() for p in self.processes)

    def close(self):
        for tasks in self.tasks:
            try:
                tasks.put(None)
            except (ValueError, OSError):
                pass
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)


def _serve(rank, world, port, backend, device, tasks, results):
    os.environ.update(MULTICAST_OFF)
    import torch
    import torch.distributed as dist
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    try:
        while True:
            case = tasks.get()
            if case is None:
                break
            try:
                results.put((rank, "ok", run_case(rank, world, device, case)))
            except Exception as error:  # the parent decides whether it was expected
                results.put((rank, "error", (type(error).__name__, str(error),
                                             traceback.format_exc())))
    finally:
        dist.destroy_process_group()


def run_case(rank, world, device, case):
    """This rank's part of one context-parallel call and its backward:
    case = dict(mode, dtype, problem (context_parallel_attention's keyword arguments, cu_seqlens
    as lists), q, k, v, d_o (the whole tensors, or with split=False every rank's part as it is),
    sinks / alibi_slopes (or None), optionally torch_seed: torch's default generator is seeded
    with it + rank first, so that every rank's draws differ). Returns this rank's o, lse, dq, dk, dv and dsinks (its
    share) as float32 NumPy arrays."""
    import torch
    import fusedattn.distributed as cp
    if "torch_seed" in case:  # each rank its own state of torch's default generator
        torch.manual_seed(case["torch_seed"] + rank)
    dtype = getattr(torch, case["dtype"])
    problem = dict(case["problem"])
    layout = problem.get("layout", "bshd")

    def part(name, cu_seqlens):
        local = torch.from_numpy(case[name]).to(device=device, dtype=dtype)
        if case.get("split", True):
            local = cp.shard(local, rank, world, layout=layout,
                             cu_seqlens=cu_seqlens if layout == "thd" else None)
        return local.contiguous().requires_grad_()

    q = part("q", problem.get("cu_seqlens_q"))
    k = part("k", problem.get("cu_seqlens_kv"))
    v = part("v", problem.get("cu_seqlens_kv"))
    per_head = {}
    for name in ("sinks", "alibi_slopes"):
        if case.get(name) is not None:
            per_head[name] = torch.from_numpy(case[name]).to(device).requires_grad_(
                name == "sinks")
    o, lse = cp.context_parallel_attention(q, k, v, mode=case["mode"], return_lse=True,
                                           **per_head, **problem)
    d_o = part("d_o", problem.get("cu_seqlens_q")).detach()
    o.backward(d_o)

    def out(t):
        return None if t is None else t.detach().float().cpu().numpy()
    sinks = per_head.get("sinks")
    return dict(o=out(o), lse=out(lse), dq=out(q.grad), dk=out(k.grad), dv=out(v.grad),
                dsinks=None if sinks is None else out(sinks.grad))


def as_arrays(tensors):
    """Torch tensors of a case as float32 NumPy arrays (None stays None)."""
    return {name: None if t is None else np.ascontiguousarray(t.detach().float().cpu().numpy())
            for name, t in tensors.items()}
