"""Print torch's results of the float16 ops that ``tests/test_f16_loop.py`` holds.

Run with the environment of ``requirements-torch.txt`` (torch 2.13 CPU, AVX2)::

    python conformance/generators/probe_f16_ops.py

As ``probe_bf16_ops.py``, for ``Half``: each op runs on a 33-element float16 tensor whose
elements 0 (the vectorised body) and 32 (the scalar tail, ``numel % 32``) hold the same
inputs; it prints the input bits and the result bits at both places, then, for
``a.add(b, alpha)`` on tensors of 1 to 100 elements, which elements take the body's FMA
(``F``) and which the tail's ``a + R(b*R(alpha))`` (``T``): the tail is the last
``numel % 32`` elements (``refopt.reference.bf16.TAIL_LANES_F16``), and one
``AveragedModel`` EMA update on float16. Another machine
(AVX-512) may give other tails.
"""

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

CASES = [  # op, input bits (a, b[, c]), the call
    ("lerp", (47687, 15190), lambda a, b: a.lerp(b, 0.9)),
    ("addcmul", (13415, 47935, 14946), lambda a, b, c: a.addcmul(b, c, value=0.37)),
    ("addcdiv", (16218, 16085, 13697), lambda a, b, c: a.addcdiv(b, c, value=-0.37)),
    ("add", (13769, 47576), lambda a, b: a.add(b, alpha=0.37)),
]


def tensor(bits, n=33):
    signed = bits - 0x10000 if bits >= 0x8000 else bits  # the uint16 bits as int16
    return torch.full((n,), signed, dtype=torch.int16).view(torch.float16)


def tensor_of(bits):
    return torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in bits],
                        dtype=torch.int16).view(torch.float16)


def as_bits(t):
    return t.view(torch.int16).to(torch.int32) & 0xFFFF


def main():
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    for name, ins, op in CASES:
        out = as_bits(op(*(tensor(b) for b in ins)))
        print(f"{name:8s} {ins} body={int(out[0])} tail={int(out[32])}")
    body = int(as_bits(tensor(13769, 64).add(tensor(47576, 64), alpha=0.37))[0])
    for n in (1, 31, 32, 33, 63, 64, 65, 100):
        out = as_bits(tensor(13769, n).add(tensor(47576, n), alpha=0.37))
        print(f"add, {n:3d} elements:", "".join("F" if int(o) == body else "T" for o in out))
    avg = tensor_of([15671, 13068, 14420])  # AveragedModel's EMA: copy, then lerp_(w, 0.1)
    p = torch.nn.Parameter(avg.clone())
    ema = AveragedModel(torch.nn.ParameterList([p]), multi_avg_fn=get_ema_multi_avg_fn(0.9))
    ema.update_parameters(torch.nn.ParameterList([p]))
    with torch.no_grad():
        p.copy_(tensor_of([15676, 13143, 14435]))
    ema.update_parameters(torch.nn.ParameterList([p]))
    print("EMA 0.9 of (15671, 13068, 14420) then (15676, 13143, 14435):",
          as_bits(next(ema.parameters()).detach()).tolist())
    three = torch.full((1,), 3.0, dtype=torch.float16)
    print("mul_(1 + 3*2**-12) of 3:", three.mul_(1 + 3 * 2.0**-12).item())
    one = torch.ones(1, dtype=torch.float16)
    print("add_(2**-11 + 2**-22) to 1:", one.add_(2.0**-11 + 2.0**-22).item())


if __name__ == "__main__":
    main()
