#!/usr/bin/env python3
"""The AdamW kernel's AVX-512 path, run as machine code in the Bochs CPU
emulator, held bit for bit against the scalar path, on any x86-64 CPU.

The probe (--probe) is a freestanding program linking the very object the
daemon links for that path (server/kernels: optstate_kernels_avx512) with the
entry points of avx512_kernel_probe.cc. Each case puts p, m, v, the gradient
and the params output in guest memory between guard bytes, calls the path's
leaf function in the emulator, and checks:
  - the span [begin, end) it reports is the documented one (whole 16-element
    vectors; with streaming stores from the first element on a 64-byte
    (float32) or 32-byte (bfloat16) boundary of the output; nothing for
    float16 params);
  - inside the span p, m, v (and max_exp_avg_sq in amsgrad cases) and the
    narrowed params equal the scalar path's
    (kernel_reference_driver: AdamWUpdateScalar and per-element narrowing)
    bit for bit; outside it nothing was written; every guard is intact; the
    gradient ends at the arena's end, so a read past it faults.
Some cases put NaN of every kind and infinities in the gradient, with NaN m
or v, at grad_scale 1 (the loop without the multiply and the blend) and not.
Others give the loop a second gradient to read ahead (AheadBits: the next
chunk's finite check inside this chunk's update), of each type, with one bad
value or none, around the edges of what the loop reads: the bytes it reports
read and whether it found a bad one must be the definition's (one 64-byte
vector for each 16 elements updated, where the params are streamed and there
is no amsgrad; none elsewhere), and that gradient must stay unwritten.
FindNonFiniteVectorsAvx512 is held against the definition (widen, scale in
float32, test) with NaN, infinities and overflowing values planted around
vector and block boundaries and at the edges of the stretches it reads side
by side, at scales of magnitude at most 1 (it reads the bits alone) and
above (it multiplies). CpuHasAvx512f, which picks the path, must say
yes where the guest's OS saves the ZMM state and no where it does not (where
the path's first instruction faults).

Prints one line per failure and ends with "N passed, N failed"; exits 1 on
any failure, and when the emulated CPU lacks AVX-512F.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bochs_guest  # noqa: E402

FLOAT32, BFLOAT16, FLOAT16 = 0, 1, 2
NO_PARAMS = 255
CACHED, STREAMING = 0, 1
TYPE_NAMES = {FLOAT32: "float32", BFLOAT16: "bfloat16", FLOAT16: "float16", NO_PARAMS: "none"}
TYPE_SIZES = {FLOAT32: 4, BFLOAT16: 2, FLOAT16: 2}

GUARD = 64  # bytes of guard on each side of every array
GUARD_BYTE = 0xFF  # a NaN pattern in every type
OUT_FILL = 0xA5

# The two forms of torch's lerp (1 - beta1 below or above one half).
HYPERPARAMETERS = [
    dict(name="non-default", lr=3e-3, beta1=0.85, beta2=0.995, eps=1e-7, weight_decay=0.05),
    dict(name="small-beta1", lr=2e-2, beta1=0.3, beta2=0.95, eps=1e-6, weight_decay=0.1),
]


def f32(x: float) -> float:
    return float(np.float32(x))


def constants(h: dict, step: int, grad_scale: float) -> dict:
    """ComputeAdamWConstants' scalars (double, rounded to float once)."""
    bc1 = 1.0 - h["beta1"] ** step
    bc2 = 1.0 - h["beta2"] ** step
    lerp_weight = np.float32(1.0 - h["beta1"])
    from_gradient = not abs(lerp_weight) < np.float32(0.5)
    return dict(
        decay=f32(1.0 - h["lr"] * h["weight_decay"]),
        lerp_coefficient=float(lerp_weight - np.float32(1.0)) if from_gradient else float(lerp_weight),
        beta2=f32(h["beta2"]),
        one_minus_beta2=f32(1.0 - h["beta2"]),
        neg_step_size=f32(-(h["lr"] / bc1)),
        bias_correction2_sqrt=f32(bc2 ** 0.5),
        eps=f32(h["eps"]),
        grad_scale=f32(grad_scale),
        lerp_from_gradient=int(from_gradient),
    )


def pack_header(c: dict, grad_type: int, params_type: int, store: int) -> bytes:
    """The first 48 bytes of the probe's UpdateCall and of the driver's case."""
    return struct.pack(
        "<8f4I", c["decay"], c["lerp_coefficient"], c["beta2"], c["one_minus_beta2"],
        c["neg_step_size"], c["bias_correction2_sqrt"], c["eps"], c["grad_scale"],
        c["lerp_from_gradient"], grad_type, params_type, store)


def encode_gradient(values: np.ndarray, grad_type: int) -> bytes:
    if grad_type == FLOAT32:
        return values.astype(np.float32).tobytes()
    if grad_type == FLOAT16:
        return values.astype(np.float16).tobytes()
    bits = values.astype(np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16).tobytes()  # truncation: any bfloat16 will do


def random_state(n: int, rng: np.random.Generator):
    p = rng.standard_normal(n).astype(np.float32)
    m = (rng.standard_normal(n) * 0.1).astype(np.float32)
    v = (np.abs(rng.standard_normal(n)) * 1e-2).astype(np.float32)
    # Non-finite params cover the narrowing's NaN rule (NaNs whose payload
    # would carry into the exponent, or round to infinity, without it); zeros
    # and tiny values the subnormal corners.
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF, 0xFFC08000, 0x7FC00000], np.uint32)
    p.view(np.uint32)[3::97] = np.resize(nans, p[3::97].size)
    p[50::97] = np.float32("-inf")
    v[7::89] = 0.0
    m[11::83] = np.float32(1e-40)
    grad = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 2, n)
    grad[5::61] = 0.0
    # Non-finite gradients (the daemon refuses them before the kernel, but the
    # paths must still agree on them, NaN payloads included).
    grad[9::101] = np.nan
    grad[30::103] = np.inf
    grad[31::107] = -np.inf
    # Not where the param is a NaN: a non-finite gradient makes the update a
    # NaN too, and where two NaNs meet in an addition IEEE 754 leaves open
    # whose payload the sum carries; C++ lets the compiler swap the operands
    # of an addition, and the two paths swap them differently at -O1 (make
    # sanitize) than at -O2, so there is no one right bit pattern there.
    collide = np.isnan(p) & ~np.isfinite(grad)
    grad[collide] = 1.0
    return p, m, v, grad


class PlacedAtEnd:
    """A read-only array in the arena's last bytes: a read past its end faults."""

    def __init__(self, guest, data: bytes):
        self.guest, self.size, self.data_bytes = guest, len(data), data
        self.addr = guest.put_at_arena_end(data)

    def data(self) -> bytes:
        return self.guest.get(self.addr, self.size)

    def intact(self) -> bool:
        return self.data() == self.data_bytes


class Placed:
    """An array in guest memory at `misalign` bytes past a 64-byte boundary,
    between guards of GUARD_BYTE."""

    def __init__(self, guest, data: bytes, misalign: int):
        self.guest, self.size = guest, len(data)
        self.base = guest.alloc(GUARD + misalign + self.size + GUARD, 64)
        self.addr = self.base + GUARD + misalign
        self.total = GUARD + misalign + self.size + GUARD
        guest.write(self.base, bytes([GUARD_BYTE]) * self.total)
        guest.write(self.addr, data)

    def data(self) -> bytes:
        return self.guest.get(self.addr, self.size)

    def guards_intact(self) -> bool:
        whole = self.guest.get(self.base, self.total)
        before = whole[: self.addr - self.base]
        after = whole[self.addr - self.base + self.size:]
        return set(before) <= {GUARD_BYTE} and set(after) <= {GUARD_BYTE}


def expected_span(n: int, params_type: int, store: int, out_addr: int):
    if params_type == FLOAT16:
        return 0, 0
    begin = 0
    if params_type != NO_PARAMS and store == STREAMING:
        size = TYPE_SIZES[params_type]
        if out_addr % size == 0:
            width = 16 * size
            begin = min(n, (width - out_addr % width) % width // size)
    return begin, begin + (n - begin) // 16 * 16


def first_difference(got: bytes, want: bytes, element: int):
    for i in range(0, len(got), element):
        if got[i:i + element] != want[i:i + element]:
            return i // element
    return None


# NaN of every kind (signaling, quiet, payloads, either sign) and infinities.
NON_FINITE_FLOAT32 = np.array([0x7F800001, 0x7FA00000, 0x7FC00000, 0x7FC12345, 0xFFC00001,
                               0xFF800001, 0x7F800000, 0xFF800000], np.uint32)


def with_non_finite_state(p, m, v, grad: np.ndarray):
    """Every third gradient one of NON_FINITE_FLOAT32's, and every fifth of those
    meeting a NaN m or v; params finite (where a NaN param meets a NaN update,
    the sum's payload is open: see random_state)."""
    p = np.where(np.isfinite(p), p, np.float32(0.5)).astype(np.float32)
    grad = grad.astype(np.float32)
    for i in range(0, grad.size, 3):
        grad.view(np.uint32)[i] = NON_FINITE_FLOAT32[(i // 3) % NON_FINITE_FLOAT32.size]
        if i % 5 == 0:
            (m if i % 2 else v).view(np.uint32)[i] = NON_FINITE_FLOAT32[i % 6]
    return p, m, v, grad


class UpdateCase:
    """grad_scale None: 1 or 0.37 at random. non_finite_state: NaN and
    infinite gradients meeting NaN m or v (with_non_finite_state). ahead:
    (type, raw bits) of another gradient for the loop to read ahead
    (AheadBits), or None."""

    def __init__(self, n, grad_type, params_type, store, shift, h, rng, amsgrad=False,
                 grad_scale=None, non_finite_state=False, ahead=None, label=""):
        self.n, self.grad_type, self.params_type, self.store, self.shift = (
            n, grad_type, params_type, store, shift)
        self.ahead = ahead
        if grad_scale is None:
            grad_scale = 1.0 if rng.integers(2) else 0.37
        self.c = constants(h, int(rng.integers(1, 2000)), grad_scale)
        self.p, self.m, self.v, grad = random_state(n, rng)
        if non_finite_state:
            self.p, self.m, self.v, grad = with_non_finite_state(self.p, self.m, self.v, grad)
        self.grad = encode_gradient(grad, grad_type)
        # amsgrad: max_exp_avg_sq above and below the new v by turns.
        self.amsgrad = amsgrad
        self.vmax = (self.v * np.where(np.arange(n) % 2 == 0, 0.5, 2.0).astype(np.float32)
                     if amsgrad else np.zeros(0, np.float32))
        self.name = (f"update n={n} grad={TYPE_NAMES[grad_type]} params={TYPE_NAMES[params_type]} "
                     f"store={'streaming' if store == STREAMING else 'cached'} shift={shift} "
                     f"{h['name']} grad_scale={self.c['grad_scale']:g}"
                     f"{' amsgrad' if amsgrad else ''}"
                     f"{' non-finite gradients and state' if non_finite_state else ''}"
                     f"{label}")

    def driver_input(self) -> bytes:
        return (pack_header(self.c, self.grad_type, self.params_type, self.store) +
                struct.pack("<QQ", self.n, 1 if self.amsgrad else 0) + self.p.tobytes() +
                self.m.tobytes() + self.v.tobytes() + self.vmax.tobytes() + self.grad)

    def expected_ahead(self, begin: int, end: int, out_addr: int):
        """(bad, read): how many bytes of self.ahead the update loop reads
        (one 64-byte vector for each 16 elements of its span while whole
        vectors remain, where it streams float32 or bfloat16 params aligned
        to their element and keeps no max_exp_avg_sq; else none), and
        whether they hold a value that is not finite."""
        if (self.ahead is None or self.amsgrad or self.store != STREAMING or
                self.params_type not in (FLOAT32, BFLOAT16) or
                out_addr % TYPE_SIZES[self.params_type]):
            return False, 0
        ahead_type, raw = self.ahead
        read = min(raw.nbytes // 64 * 64, (end - begin) // 16 * 64)
        if read == 0:
            return False, 0
        elements = read // TYPE_SIZES[ahead_type]
        return first_non_finite(raw[:elements], ahead_type, 1.0) < elements, read

    def read_expected(self, stream) -> None:
        n = self.n
        self.want_p, self.want_m, self.want_v = (stream.read(4 * n) for _ in range(3))
        self.want_vmax = stream.read(4 * n) if self.amsgrad else b""
        self.want_out = (stream.read(n * TYPE_SIZES[self.params_type])
                         if self.params_type != NO_PARAMS else b"")

    def run(self, guest) -> list[str]:
        guest.reset_arena()
        n = self.n
        # p, m, v 4, 36 and 12 bytes past a 64-byte boundary (the kernel's
        # loads take any alignment), the gradient at the arena's end.
        p = Placed(guest, self.p.tobytes(), 4)
        m = Placed(guest, self.m.tobytes(), 36)
        v = Placed(guest, self.v.tobytes(), 12)
        vmax = Placed(guest, self.vmax.tobytes(), 20) if self.amsgrad else None
        grad = PlacedAtEnd(guest, self.grad)
        out_size = TYPE_SIZES.get(self.params_type, 0)
        out_base = guest.alloc(GUARD + 64 + n * out_size + GUARD, 64)
        out_total = GUARD + 64 + n * out_size + GUARD
        guest.write(out_base, bytes([OUT_FILL]) * out_total)
        out_addr = out_base + GUARD + self.shift if self.params_type != NO_PARAMS else 0
        # The gradient read ahead between guards of GUARD_BYTE, a NaN in
        # every type: a read past its whole vectors would find one.
        ahead = Placed(guest, self.ahead[1].tobytes(), 8) if self.ahead is not None else None
        ahead_fields = ((ahead.addr, ahead.size, self.ahead[0]) if ahead is not None
                        else (0, 0, FLOAT32))
        call = guest.put(pack_header(self.c, self.grad_type, self.params_type, self.store) +
                         struct.pack("<9Q", p.addr, m.addr, v.addr, grad.addr, out_addr, n, 0, 0,
                                     vmax.addr if vmax is not None else 0) +
                         struct.pack("<2QIIQ", *ahead_fields, 7, 1 << 63))
        try:
            guest.call("probe_update_vectors", call)
        except bochs_guest.BochsError as error:
            return [str(error)]
        begin, end = struct.unpack("<2Q", guest.get(call + 96, 16))
        bad, read = struct.unpack("<IQ", guest.get(call + 140, 12))

        errors = []
        want_begin, want_end = expected_span(n, self.params_type, self.store, out_addr)
        if (begin, end) != (want_begin, want_end):
            errors.append(f"span [{begin}, {end}), want [{want_begin}, {want_end})")
            return errors
        want_bad, want_read = self.expected_ahead(begin, end, out_addr)
        if (bool(bad), read) != (want_bad, want_read):
            errors.append(f"read ahead {read} bytes, bad {bad}; want {want_read} bytes, "
                          f"bad {int(want_bad)}")
        if ahead is not None and (ahead.data() != self.ahead[1].tobytes() or
                                  not ahead.guards_intact()):
            errors.append("the gradient read ahead, or a guard around it, was written")
        arrays = [("p", p, self.p.tobytes(), self.want_p), ("m", m, self.m.tobytes(), self.want_m),
                  ("v", v, self.v.tobytes(), self.want_v)]
        if vmax is not None:
            arrays.append(("max_exp_avg_sq", vmax, self.vmax.tobytes(), self.want_vmax))
        for name, placed, before, want in arrays:
            got = placed.data()
            # Inside the span the scalar path's bits; outside, untouched.
            expect = before[:4 * begin] + want[4 * begin:4 * end] + before[4 * end:]
            i = first_difference(got, expect, 4)
            if i is not None:
                inside = begin <= i < end
                errors.append(
                    f"{name}[{i}] ({'inside' if inside else 'outside'} the span) is "
                    f"{got[4 * i:4 * i + 4].hex()}, want {expect[4 * i:4 * i + 4].hex()}")
            if not placed.guards_intact():
                errors.append(f"a guard around {name} was written")
        if not grad.intact():
            errors.append("the gradient was written")
        whole = guest.get(out_base, out_total)
        if self.params_type != NO_PARAMS:
            lead = out_addr - out_base
            fill = bytes([OUT_FILL])
            expect = (fill * (lead + begin * out_size) +
                      self.want_out[begin * out_size:end * out_size] +
                      fill * (out_total - lead - end * out_size))
            i = first_difference(whole, expect, 1)
            if i is not None:
                element = (i - lead) // out_size
                errors.append(f"params output byte {i - lead} (element {element}, span "
                              f"[{begin}, {end})) is {whole[i]:#04x}, want {expect[i]:#04x}")
        elif set(whole) != {OUT_FILL}:
            errors.append("memory was written where no params output was asked for")
        return errors


# Bits of NaN (two), +infinity, -infinity and the largest finite value, and a
# grad_scale that overflows the latter, per type.
SPECIALS = {
    FLOAT32: ([0x7FC00000, 0xFF800001], 0x7F800000, 0xFF800000, 0x7F7FFFFF, 2.0),
    BFLOAT16: ([0x7FC0, 0xFF81], 0x7F80, 0xFF80, 0x7F7F, 2.0),
    FLOAT16: ([0x7E00, 0xFC01], 0x7C00, 0xFC00, 0x7BFF, 1e35),
}


def widen(raw: np.ndarray, grad_type: int) -> np.ndarray:
    if grad_type == FLOAT32:
        return raw.view(np.float32)
    if grad_type == FLOAT16:
        return raw.view(np.float16).astype(np.float32)
    return (raw.astype(np.uint32) << 16).view(np.float32)


def first_non_finite(raw: np.ndarray, grad_type: int, grad_scale: float) -> int:
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = widen(raw, grad_type) * np.float32(grad_scale)
    bad = np.flatnonzero(~np.isfinite(scaled))
    return int(bad[0]) if bad.size else raw.size


CHECK_STREAMS = 8  # kCheckStreams: the stretches a range is read as, side by side


def stretch_edges(n: int, grad_type: int) -> set[int]:
    """The first and last element of each of the CHECK_STREAMS stretches and of
    what follows them, for both of the path's whole-range checks: from the
    bits alone (stretches of whole 64-byte vectors) and with the multiply
    (whole 16-element vectors)."""
    size = TYPE_SIZES[grad_type]
    edges = set()
    for stretch in (n * size // CHECK_STREAMS // 64 * 64 // size, n // CHECK_STREAMS // 16 * 16):
        for s in range(CHECK_STREAMS + 1):
            edges.update({s * stretch - 1, s * stretch})
    edges.add(n - 1)
    return {e for e in edges if 0 <= e < n}


def find_cases(rng: np.random.Generator):
    """(name, grad_type, raw bits, grad_scale). Scales of magnitude at most 1
    take the bits-only check, larger ones the multiply; 0 turns an infinity
    into NaN."""
    for grad_type in (FLOAT32, BFLOAT16, FLOAT16):
        dtype = np.uint32 if grad_type == FLOAT32 else np.uint16
        nans, plus_inf, minus_inf, largest, overflow_scale = SPECIALS[grad_type]
        scales = (1.0, overflow_scale, -1.0, 0.5, 0.0, -overflow_scale)

        def finite(n):
            return np.frombuffer(encode_gradient(rng.standard_normal(n), grad_type), dtype).copy()

        name = TYPE_NAMES[grad_type]
        for n in (16, 256, 272, 3008):
            for scale in scales:
                yield f"find {name} n={n} all finite, scale {scale:g}", grad_type, finite(n), scale
        # Whole vectors that end half-way through a 64-byte load (16-bit
        # types: 16 and 1040 elements, 32 and 2080 bytes), read to the last.
        for n in (16, 1040):
            clean = finite(n)
            for at in range(n - 16, n):
                for bits in (nans[1], minus_inf):
                    raw = clean.copy()
                    raw[at] = bits
                    for scale in (1.0, -0.5, 1.5):
                        yield (f"find {name} n={n} {bits:#x} at {at}, scale {scale:g}", grad_type,
                               raw, scale)
        n = 3008
        for at in sorted(stretch_edges(n, grad_type)):
            raw = finite(n)
            raw[at] = nans[0]
            for scale in (1.0, 0.25, 1.5):
                yield f"find {name} stretch edge {at}, scale {scale:g}", grad_type, raw.copy(), scale
            if at + 1 < n:
                raw[n - 1 - (n - 1 - at) // 2] = plus_inf
                for scale in (1.0, 0.25, 1.5):
                    yield (f"find {name} stretch edge {at} and a later one, scale {scale:g}",
                           grad_type, raw.copy(), scale)
        for first in (0, 1, 15, 16, 17, 255, 256, 257, 1023, 2047, 2048, 2990, 3007):
            for bits in (*nans, plus_inf, minus_inf):
                raw = finite(n)
                raw[first] = bits
                # A later bad value in the same 16-element vector, and at the end.
                later = first | 15
                if later != first:
                    raw[later] = minus_inf if bits != minus_inf else nans[0]
                if n - 1 not in (first, later):
                    raw[n - 1] = plus_inf
                yield f"find {name} {bits:#x} at {first}", grad_type, raw, 1.0
            raw = finite(n)
            raw[first] = largest
            yield f"find {name} largest finite at {first}, scale 1", grad_type, raw, 1.0
            yield (f"find {name} largest finite at {first}, scale {overflow_scale}", grad_type,
                   raw, overflow_scale)
        for trial in range(40):
            raw = finite(n)
            for _ in range(int(rng.integers(0, 4))):
                raw[int(rng.integers(0, n))] = rng.choice([*nans, plus_inf, minus_inf, largest])
            scale = scales[trial % len(scales)]
            yield f"find {name} random trial {trial}, scale {scale:g}", grad_type, raw, scale


def ahead_cases(rng: np.random.Generator) -> list:
    """Updates that read another gradient ahead (AheadBits): of each type,
    shorter than the loop reads (the rest left to the caller), as long, and
    longer; one bad value at a vector's first and last element, just inside
    and just past the part read, or none; with the stores, params, alignment
    and amsgrad that read it and those that leave it unread."""
    cases = []
    for ahead_type in (FLOAT32, BFLOAT16, FLOAT16):
        dtype = np.uint32 if ahead_type == FLOAT32 else np.uint16
        nans, plus_inf, minus_inf, _, _ = SPECIALS[ahead_type]
        size = TYPE_SIZES[ahead_type]
        for n, ahead_bytes in ((1031, 64 * 7 + 36), (1031, 1024 * 4 + 20), (4099, 4099 * 4),
                               (31, 256), (7, 128)):
            elements = ahead_bytes // size
            clean = np.frombuffer(encode_gradient(rng.standard_normal(elements), ahead_type),
                                  dtype).copy()
            # The loop reads 64 bytes for every 16 elements it updates.
            read_max = min(ahead_bytes // 64 * 64, (n // 16) * 64) // size
            positions = {None, 0, 64 // size - 1, 64 // size, elements - 1}
            if read_max > 0:
                positions |= {read_max - 1, min(read_max, elements - 1)}
            for at in sorted(positions, key=lambda x: -1 if x is None else x):
                raw = clean.copy()
                if at is not None:
                    raw[at] = (nans[at % 2], plus_inf, minus_inf)[at % 3]
                for params_type, store, shift, amsgrad in (
                        (FLOAT32, STREAMING, 0, False), (BFLOAT16, STREAMING, 2, False),
                        (FLOAT32, STREAMING, 12, False), (BFLOAT16, STREAMING, 1, False),
                        (FLOAT32, CACHED, 0, False), (FLOAT32, STREAMING, 0, True),
                        (FLOAT16, STREAMING, 0, False), (NO_PARAMS, STREAMING, 0, False)):
                    grad_type = (FLOAT32, BFLOAT16)[len(cases) % 2]
                    h = HYPERPARAMETERS[len(cases) % 2]
                    cases.append(UpdateCase(
                        n, grad_type, params_type, store, shift, h, rng, amsgrad=amsgrad,
                        ahead=(ahead_type, raw),
                        label=(f" ahead {TYPE_NAMES[ahead_type]} {ahead_bytes} bytes, "
                               f"{'none bad' if at is None else f'bad at {at}'}")))
    return cases


def run_find(guest, grad_type: int, raw: np.ndarray, grad_scale: float) -> list[str]:
    guest.reset_arena()
    grad = PlacedAtEnd(guest, raw.tobytes())
    call = guest.put(struct.pack("<2QIfQ", grad.addr, raw.size, grad_type, grad_scale, 1 << 63))
    try:
        guest.call("probe_find_non_finite", call)
    except bochs_guest.BochsError as error:
        return [str(error)]
    got = struct.unpack("<Q", guest.get(call + 24, 8))[0]
    want = first_non_finite(raw, grad_type, grad_scale)
    errors = [] if got == want else [f"answered {got}, want {want}"]
    if not grad.intact():
        errors.append("the gradient was written")
    return errors


def cpu_choice_cases(guest):
    """(name, errors): CpuHasAvx512f in the guest as it is (its OS saves the ZMM state),
    then with an OS that does not (XCR0 without opmask and ZMM, the program's statics
    reloaded): CPUID still lists AVX-512F, but the path's first instruction faults, which
    is why the check reads XGETBV too."""
    def ask() -> int:
        guest.reset_arena()
        answer = guest.alloc(8)
        guest.call("probe_cpu_has_avx512f", answer)
        return struct.unpack("<Q", guest.get(answer, 8))[0]

    guest.reload_image()
    got = ask()
    yield "CpuHasAvx512f, OS saves ZMM state", [] if got == 1 else [f"answered {got}, want 1"]
    guest.xcr0 = bochs_guest.XCR0_AVX
    guest.reload_image()
    got = ask()
    yield ("CpuHasAvx512f, OS without ZMM state (CPUID still lists AVX-512F)",
           [] if got == 0 else [f"answered {got}, want 0"])
    case = UpdateCase(16, FLOAT32, NO_PARAMS, CACHED, 0, HYPERPARAMETERS[0],
                      np.random.default_rng(0))
    errors = case.run(guest)
    faulted = len(errors) == 1 and "#UD" in errors[0]
    yield ("the AVX-512 path without ZMM state faults (#UD)",
           [] if faulted else [f"expected a #UD, got {errors or 'no fault'}"])
    guest.xcr0 = bochs_guest.XCR0_AVX512


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", required=True, help="the freestanding probe ELF")
    parser.add_argument("--reference", required=True, help="kernel_reference_driver")
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = parser.parse_args()
    print(f"seed {args.seed} (rerun with --seed {args.seed})")
    rng = np.random.default_rng(args.seed)

    guest = bochs_guest.Guest(args.probe)
    features = guest.cpuid()
    if not features["avx512f"] or features["xcr0"] & 0xE6 != 0xE6:
        print(f"FAIL: the emulated CPU has no usable AVX-512F: {features}")
        return 1

    cases = []
    for n in (7, 16, 31, 1031, 4099):
        for grad_type in (FLOAT32, BFLOAT16, FLOAT16):
            for store in (CACHED, STREAMING):
                h = HYPERPARAMETERS[len(cases) % 2]
                cases.append(UpdateCase(n, grad_type, NO_PARAMS, store, 0, h, rng))
                cases.append(UpdateCase(n, grad_type, NO_PARAMS, store, 0, h, rng, amsgrad=True))
                for params_type in (FLOAT32, BFLOAT16, FLOAT16):
                    for shift in (0, 1, 2, 4, 12, 28, 32, 36, 60):
                        h = HYPERPARAMETERS[len(cases) % 2]
                        cases.append(UpdateCase(n, grad_type, params_type, store, shift, h, rng,
                                                amsgrad=len(cases) % 3 == 0))
    # At grad_scale 1 with m's lerp from m (non-default's beta1) the loop
    # leaves out the multiply and the blend; the NaNs it returns must not change.
    # The bfloat16 params out narrow the NaNs that result, quiet ones only.
    for h in HYPERPARAMETERS:
        for grad_scale in (1.0, 0.37):
            for amsgrad in (False, True):
                for params_type in (FLOAT32, BFLOAT16):
                    cases.append(UpdateCase(1031, FLOAT32, params_type, CACHED, 4, h, rng,
                                            amsgrad=amsgrad, grad_scale=grad_scale,
                                            non_finite_state=True))

    cases += ahead_cases(rng)

    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        with open(inputs, "wb") as f:
            for case in cases:
                f.write(case.driver_input())
        subprocess.run([args.reference, inputs, outputs], check=True)
        with open(outputs, "rb") as f:
            for case in cases:
                case.read_expected(f)
            if f.read(1):
                print("FAIL: the reference driver wrote more than the cases asked for")
                return 1

    passed = failed = 0

    def record(name: str, errors: list[str]) -> None:
        nonlocal passed, failed
        if errors:
            failed += 1
            for error in errors:
                print(f"FAIL {name}: {error}")
        else:
            passed += 1

    for case in cases:
        record(case.name, case.run(guest))
    for name, grad_type, raw, grad_scale in find_cases(rng):
        record(name, run_find(guest, grad_type, raw, grad_scale))
    for name, errors in cpu_choice_cases(guest):
        record(name, errors)
    guest.close()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
