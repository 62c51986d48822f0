"""Host staging of parameters that live on a GPU, for RemoteAdamW.

Each staged parameter has two host slots, in its own dtype: its gradient and its values.
A gradient is copied device-to-host on a side stream as soon as it is final (a
post-accumulate-grad hook, or DDP's comm hook after the bucket's all-reduce); step() hands
the daemon the host slots and, once it returns, copies each parameter's new values back on
the side stream; the next use waits for that copy by a stream wait (an event), never by a
global synchronize. Which gradient a slot holds is known by the tensor it was copied from,
its version counter and its fingerprint (a sum of its bits, taken on the copy's stream
just before the copy: a change while the copy runs, which the side stream does not wait
for, changes it too), so a gradient changed after its copy is copied again at step():
torch's clip_grad_norm_, another micro-batch or anything in place moves the version
counter; GradScaler's unscale_, a collective on p.grad (dist.all_reduce) or an edit through
p.grad.data do not, and change the fingerprint. The hooks only move the copy earlier, they
never decide what is stepped.

The copy engines are the only device-specific part: CudaCopies (streams, events, pinned
or cudaHostRegister-ed memory) and HostCopies, which stages CPU tensors through the same
slots with copies run in order by a worker thread, each ending an event, as a side stream
does (RemoteAdamW(staging="always"): how the path, its waits included, is tested without
a GPU).
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from . import errors

__all__ = ["Staging", "HostCopies", "CudaCopies", "HOST_COPY_DELAY_S"]

_ALIGN = 64  # Each slot starts on a cache line (and the daemon's zero-copy path wants 64).


# How long HostCopies' worker waits before each copy: 0, except in tests, which widen the
# window a missing wait would lose (the copy then lands after the reader has read).
HOST_COPY_DELAY_S = 0.0


def _fingerprint(t: torch.Tensor) -> torch.Tensor:
    """The sum of t's elements' bits as integers (an int64 0-d tensor on t's device): an
    in-place change of any element changes it, but for changes that cancel exactly."""
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(bits).sum(dtype=torch.int64)


class _HostEvent:
    """The end of one HostCopies copy (CUDA events' synchronize and query)."""

    def __init__(self):
        self._done = threading.Event()
        self.error: Optional[BaseException] = None

    def synchronize(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error

    def query(self) -> bool:
        return self._done.is_set()


class HostCopies:
    """Copies for CPU tensors staged as a device's would be (staging="always"): a worker
    thread runs them one after another in the order issued, as a side stream does, each
    ending its event, so the waits the staging logic places are needed on the CPU too. The
    host is the "current stream" here: what it did before a copy was issued is done, and
    waiting on an event from it blocks until the copy is."""

    kind = "host"

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: Optional[threading.Thread] = None

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def register(self, buffer: torch.Tensor) -> None:
        pass

    def unregister(self, buffer: torch.Tensor) -> None:
        pass

    def _issue(self, target: torch.Tensor, source: torch.Tensor,
               fingerprint: Optional[torch.Tensor] = None) -> _HostEvent:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="optstate-staging",
                                            daemon=True)
            self._worker.start()
        event = _HostEvent()
        # The tensors stay alive until copied.
        self._queue.put((target, source, fingerprint, event))
        return event

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            target, source, fingerprint, event = item
            try:
                if HOST_COPY_DELAY_S:
                    time.sleep(HOST_COPY_DELAY_S)
                if fingerprint is not None:
                    fingerprint.copy_(_fingerprint(source))
                target.copy_(source)
            except BaseException as e:  # raised to whoever waits for it
                event.error = e
            event._done.set()

    def to_host(self, source: torch.Tensor, slot: torch.Tensor):
        """Copies source into slot: (its event, source's fingerprint taken just before the
        copy, ready once the event is)."""
        fingerprint = torch.zeros((), dtype=torch.int64)
        return self._issue(slot, source, fingerprint), fingerprint

    def to_device(self, slot: torch.Tensor, target: torch.Tensor) -> _HostEvent:
        return self._issue(target, slot)

    def changed(self, sources: list, fingerprints: list) -> list:
        """Whether each source's fingerprint now differs from the one given (the copies
        that took those are done: their events were waited for)."""
        return [bool(_fingerprint(s) != f) for s, f in zip(sources, fingerprints)]

    def wait_on_stream(self, event: _HostEvent) -> None:
        event.synchronize()

    def stop(self) -> None:
        """Ends the worker once the copies issued are done."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None


class CudaCopies:
    """Copies between one CUDA device and pinned host memory on a side stream of that
    device. Each copy first waits (on the GPU) for what the current stream has queued, so
    it reads a finished gradient and overwrites values nothing still reads; the tensor it
    reads from is marked used by the side stream (record_stream), so the caching allocator
    does not hand its memory out before the copy is done."""

    kind = "cuda"

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def register(self, buffer: torch.Tensor) -> None:
        """Pins memory allocated elsewhere (the daemon's shared buffer) for async copies."""
        # cudaHostRegisterPortable (1): pinned for every CUDA context, not only this one's.
        code = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 1)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister of {buffer.numel()} bytes of the shared "
                               f"buffer failed (cudaError {int(code)})")

    def unregister(self, buffer: torch.Tensor) -> None:
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())

    def _after_current(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def to_host(self, source: torch.Tensor, slot: torch.Tensor):
        """Copies source into slot: (its event, source's fingerprint taken just before the
        copy, a device tensor of the side stream, ready once the event is)."""
        self._after_current()
        with torch.cuda.stream(self.stream):
            fingerprint = _fingerprint(source)
            slot.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        source.record_stream(self.stream)
        return event, fingerprint

    def changed(self, sources: list, fingerprints: list) -> list:
        """Whether each source's fingerprint now differs from the one given: computed on the
        side stream after what the current stream has queued, read back in one copy."""
        self._after_current()
        with torch.cuda.stream(self.stream):
            now = torch.stack([_fingerprint(s) for s in sources])
            differs = torch.ne(now, torch.stack(fingerprints)).cpu()
        for s in sources:
            s.record_stream(self.stream)
        return differs.tolist()

    def to_device(self, slot: torch.Tensor, target: torch.Tensor):
        self._after_current()
        with torch.cuda.stream(self.stream):
            target.copy_(slot, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        target.record_stream(self.stream)
        return event

    def wait_on_stream(self, event) -> None:
        """The current stream's later work waits for `event` (no host synchronize)."""
        torch.cuda.current_stream(self.device).wait_event(event)

    def stop(self) -> None:
        pass


@dataclass(eq=False)
class _Slot:
    """One staged parameter: its host slots and what they hold."""

    param: torch.Tensor
    name: str
    device: torch.device  # the parameter's, when its slots were made
    copies: Any  # HostCopies or CudaCopies
    grad: torch.Tensor  # host, p's dtype and shape
    values: torch.Tensor  # host, p's dtype and shape
    nbytes: int  # of each slot
    # What `grad` holds: (weak reference to the tensor copied, its data_ptr, its _version);
    # the reference is None for a copy from a DDP bucket (then the pointer identifies it:
    # the bucket's memory lives as long as the DDP model).
    staged: Optional[tuple] = None
    fingerprint: Any = None  # of the gradient just before the last copy read it
    to_check: Any = None  # the gradient step() takes from an earlier copy: recopy_changed
    grad_copied: Any = None  # event of the last gradient copy
    values_copied: Any = None  # event of the last values copy (host slot -> device)
    waiting: bool = False  # values copied back and not yet waited for by a stream
    hook: Any = None


@dataclass
class _Counters:
    gradients_copied_early: int = 0  # in backward (hook) or in DDP's comm hook
    gradients_copied_at_step: int = 0  # changed after the early copy, or no early copy
    # Of those, copied again because their fingerprint changed with no version change.
    gradients_changed_in_place: int = 0
    values_copied: int = 0


@dataclass
class _Buffer:
    memory: torch.Tensor
    copies: Any
    kind: str  # "shared_buffer", "pinned" or "host"
    slots: list = field(default_factory=list)


class Staging:
    """The host slots of one RemoteAdamW's staged parameters (see the module docstring)."""

    def __init__(self, cpu_test_switch: bool):
        self._cpu = cpu_test_switch
        self._slots: dict[int, _Slot] = {}  # by id(parameter)
        self._buffers: list[_Buffer] = []
        self._copies: dict[Any, Any] = {}  # device -> its copy engine
        self._counters = _Counters()
        self._lock = threading.Lock()  # DDP's comm hook callbacks may run on other threads
        self._via_ddp = False
        self._forward_waits: set[int] = set()  # ids of params a forward pre-hook waits for
        self._module_hooks: list = []  # those forward pre-hooks
        self._closed = False

    # -- which parameters ----------------------------------------------------------------

    @property
    def engaged(self) -> bool:
        """Whether any CPU parameter may be staged: the test switch, or slots exist."""
        return self._cpu or bool(self._slots)

    def wants(self, p: torch.Tensor) -> bool:
        """Whether p is staged: a CUDA parameter, or any CPU one under the test switch."""
        return p.is_cuda or (self._cpu and p.is_cpu)

    def holds(self, p: torch.Tensor) -> bool:
        return id(p) in self._slots

    def device_of(self, p: torch.Tensor) -> Optional[torch.device]:
        """The device p's slots were made for, or None when p is not staged."""
        slot = self._slots.get(id(p))
        return None if slot is None else slot.device

    def _copies_for(self, device: torch.device):
        engine = self._copies.get(device)
        if engine is None:
            engine = HostCopies() if device.type == "cpu" else CudaCopies(device)
            self._copies[device] = engine
        return engine

    def add(self, params: list[tuple[torch.Tensor, str]], client) -> None:
        """Slots for `params` ((parameter, daemon group name) each), one host buffer per
        device: in a buffer shared with the daemon where the client has the same-host data
        plane (the daemon then reads and writes the slots in place), else pinned memory of
        this process; parameters that do not require grad are left out. Each slotted
        parameter gets a post-accumulate-grad hook."""
        by_device: dict[Any, list] = {}
        for p, name in params:
            # A frozen parameter gets its slots only if it ever has a gradient to step
            # (RemoteAdamW adds it then): a frozen base model costs no host staging.
            if id(p) not in self._slots and p.requires_grad:
                by_device.setdefault(p.device, []).append((p, name))
        for device, placed in by_device.items():
            copies = self._copies_for(device)
            offsets, total = [], 0
            for p, _ in placed:
                nbytes = p.numel() * p.element_size()
                padded = (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
                offsets.append((total, total + padded, nbytes))
                total += 2 * padded
            memory, kind = self._allocate(client, copies, max(total, _ALIGN))
            buffer = _Buffer(memory, copies, kind)
            self._buffers.append(buffer)
            for (p, name), (grad_at, values_at, nbytes) in zip(placed, offsets):
                grad = memory[grad_at:grad_at + nbytes].view(p.dtype).view(p.shape)
                values = memory[values_at:values_at + nbytes].view(p.dtype).view(p.shape)
                slot = _Slot(p, name, device, copies, grad, values, nbytes)
                slot.hook = p.register_post_accumulate_grad_hook(self._on_gradient_final)
                self._slots[id(p)] = slot
                buffer.slots.append(slot)

    @staticmethod
    def _allocate(client, copies, nbytes: int) -> tuple[torch.Tensor, str]:
        try:
            memory = torch.from_numpy(client.allocate_shared_buffer(nbytes))
        except errors.FailedPrecondition:  # a wire client: no memory shared with the daemon
            return copies.host_buffer(nbytes), "pinned" if copies.kind == "cuda" else "host"
        copies.register(memory)
        return memory, "shared_buffer"

    def forget_all_but(self, present: set) -> None:
        """Drops the slots of parameters whose ids are not in `present`."""
        for key in [k for k in self._slots if k not in present]:
            self.forget(self._slots[key].param)

    def forget(self, p: torch.Tensor) -> None:
        """Drops p's slot (a refused add_param_group); its buffer goes with the last slot."""
        slot = self._slots.pop(id(p), None)
        if slot is None:
            return
        if slot.hook is not None:
            slot.hook.remove()
        for buffer in list(self._buffers):
            if slot in buffer.slots:
                buffer.slots.remove(slot)
                if not buffer.slots:
                    self._release(buffer)

    # -- gradients -----------------------------------------------------------------------

    def _on_gradient_final(self, p: torch.Tensor) -> None:
        """The post-accumulate-grad hook: p.grad is final for this backward pass."""
        if self._via_ddp or self._closed:
            return  # DDP's comm hook copies it once it is all-reduced
        slot = self._slots.get(id(p))
        if slot is not None and p.grad is not None:
            self._copy_gradient(slot, p.grad, weakref.ref(p.grad), early=True)

    def _copy_gradient(self, slot: _Slot, source: torch.Tensor, reference, early: bool) -> None:
        event, fingerprint = slot.copies.to_host(source.detach(), slot.grad)
        with self._lock:
            slot.staged = (reference, source.data_ptr(), source._version)
            slot.fingerprint = fingerprint
            slot.to_check = None
            slot.grad_copied = event
            if early:
                self._counters.gradients_copied_early += 1
            else:
                self._counters.gradients_copied_at_step += 1

    def _holds_current(self, slot: _Slot, grad: torch.Tensor) -> bool:
        staged = slot.staged
        if staged is None:
            return False
        reference, pointer, version = staged
        if pointer != grad.data_ptr() or version != grad._version:
            return False
        return reference is None or reference() is grad

    def gradient(self, p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """p's host gradient slot, holding `grad` (copied now unless an early copy of this
        very gradient is there). The copy may still run: wait_for_gradients() before the
        slot is read."""
        slot = self._slots[id(p)]
        with self._lock:
            current = self._holds_current(slot, grad)
            if current:
                slot.to_check = grad
        if not current:
            self._copy_gradient(slot, grad, weakref.ref(grad), early=False)
        return slot.grad

    def recopy_changed(self, params) -> None:
        """Copies again each of `params`' gradients that gradient() took from an earlier
        copy and that changed in place since without moving its version counter
        (GradScaler's unscale_, dist.all_reduce of p.grad, p.grad.data edits): its
        fingerprint now differs from the copy's. Call after wait_for_gradients(params);
        waits for the copies it makes."""
        by_engine: dict[Any, list] = {}
        with self._lock:
            for p in params:
                slot = self._slots[id(p)]
                if slot.to_check is not None:
                    by_engine.setdefault(slot.copies, []).append((slot, slot.to_check))
                    slot.to_check = None
        again = []
        for copies, checked in by_engine.items():
            changed = copies.changed([grad for _, grad in checked],
                                     [slot.fingerprint for slot, _ in checked])
            for (slot, grad), differs in zip(checked, changed):
                if differs:
                    self._copy_gradient(slot, grad, weakref.ref(grad), early=False)
                    again.append(slot)
        with self._lock:
            self._counters.gradients_changed_in_place += len(again)
        for slot in again:  # all issued first, then waited for
            slot.grad_copied.synchronize()

    def wait_for_gradients(self, params) -> None:
        """Blocks until the gradient copies of `params` are in their host slots."""
        for p in params:
            event = self._slots[id(p)].grad_copied
            if event is not None:
                event.synchronize()

    def scalar_to_host(self, value: torch.Tensor) -> float:
        """One device scalar (the clipping scale) read through the side stream."""
        if value.device.type == "cpu":
            return float(value)
        copies = self._copies_for(value.device)
        host = torch.empty(1, dtype=value.dtype, pin_memory=True)
        copies.to_host(value.reshape(1), host)[0].synchronize()
        return float(host[0])

    # -- values --------------------------------------------------------------------------

    def values(self, p: torch.Tensor) -> torch.Tensor:
        """p's host values slot, for the daemon to write: the last copy from it is done."""
        slot = self._slots[id(p)]
        if slot.values_copied is not None:
            slot.values_copied.synchronize()
            slot.values_copied = None
        return slot.values

    def copy_values_back(self, params) -> None:
        """Starts the copy of each of `params`' new values to its device; the current
        stream waits for it, except for parameters a forward pre-hook waits for
        (wait_in_forward)."""
        for p in params:
            slot = self._slots[id(p)]
            slot.values_copied = slot.copies.to_device(slot.values, p.data)
            self._counters.values_copied += 1
            if id(p) in self._forward_waits:
                slot.waiting = True
            else:
                slot.copies.wait_on_stream(slot.values_copied)

    def wait_in_forward(self, module: torch.nn.Module) -> list:
        """Forward pre-hooks on `module` and its submodules: each waits (a stream wait) for
        the copies of the staged parameters it holds itself, so the first layers of the
        next forward run while later layers' values are still being copied. close()
        removes the hooks."""
        for submodule in module.modules():
            own = [p for p in submodule.parameters(recurse=False) if id(p) in self._slots]
            if not own:
                continue
            for p in own:
                self._forward_waits.add(id(p))
            self._module_hooks.append(submodule.register_forward_pre_hook(
                lambda _module, _args, own=tuple(own): self._wait_for(own)))

    def _wait_for(self, params) -> None:
        for p in params:
            slot = self._slots.get(id(p))
            if slot is not None and slot.waiting:
                slot.waiting = False
                slot.copies.wait_on_stream(slot.values_copied)

    def wait_for_values(self) -> None:
        """The current stream waits for every values copy not yet waited for (before the
        optimizer itself reads the parameters: broadcast, state_dict)."""
        self._wait_for([slot.param for slot in self._slots.values()])

    # -- DDP ----------------------------------------------------------------------------

    def ddp_comm_hook(self, process_group):
        """A DDP comm hook: all-reduces the bucket (the mean, as DDP's default), then copies
        the gradients of the bucket's staged parameters to their host slots, the moment
        they are final."""
        import torch.distributed as dist

        self._via_ddp = True
        world = dist.get_world_size(process_group)

        def hook(_state, bucket):
            buffer = bucket.buffer()
            buffer.div_(world)
            future = dist.all_reduce(buffer, group=process_group, async_op=True).get_future()

            def copy_final(done):
                result = done.value()[0]
                for p, grad in zip(bucket.parameters(), bucket.gradients()):
                    slot = self._slots.get(id(p))
                    if slot is not None and not self._closed:
                        self._copy_gradient(slot, grad, None, early=True)
                return result

            return future.then(copy_final)

        return hook

    # -- memory --------------------------------------------------------------------------

    def stats(self) -> dict:
        """Host staging memory and copy counts (RemoteAdamW.stats()['staging'])."""
        with self._lock:
            counters = dict(vars(self._counters))
        return {"bytes": sum(int(b.memory.numel()) for b in self._buffers),
                "kinds": sorted({b.kind for b in self._buffers}),
                "parameters": {slot.name: 2 * slot.nbytes for slot in self._slots.values()},
                **counters}

    def close(self) -> None:
        """Removes the hooks and releases every host buffer (pinned memory unpinned, shared
        buffers unmapped once nothing else views them). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots.values():
            if slot.hook is not None:
                slot.hook.remove()
            if slot.values_copied is not None:
                slot.values_copied.synchronize()
            if slot.grad_copied is not None:
                slot.grad_copied.synchronize()
        for copies in self._copies.values():
            copies.stop()
        self._copies.clear()
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks.clear()
        for buffer in list(self._buffers):
            self._release(buffer)
        self._slots.clear()
        self._forward_waits.clear()

    def _release(self, buffer: _Buffer) -> None:
        if buffer.kind == "shared_buffer":
            buffer.copies.unregister(buffer.memory)
        self._buffers.remove(buffer)
        for slot in buffer.slots:
            slot.grad = slot.values = None
        buffer.slots.clear()
        buffer.memory = None
