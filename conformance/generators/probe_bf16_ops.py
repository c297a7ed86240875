"""Print torch's results of the bfloat16 ops that ``tests/test_bf16_dtype.py`` holds.

Run with the environment of ``requirements-torch.txt`` (torch 2.13 CPU, AVX2)::

    python conformance/generators/probe_bf16_ops.py

Each op runs on a 33-element bfloat16 tensor whose elements 0 (the vectorised body) and 32
(the scalar tail, ``numel % 32``) hold the same inputs; it prints the input bits and the
result bits at both places (``TORCH_OPS`` in the test). Another machine (AVX-512: 64
elements per loop iteration) may give other tails.
"""

import torch

CASES = [  # op, input bits (a, b[, c]), the call
    ("lerp", (16385, 16114), lambda a, b: a.lerp(b, 0.9)),
    ("addcmul", (48854, 16298, 16210), lambda a, b, c: a.addcmul(b, c, value=0.37)),
    ("addcdiv", (16179, 16321, 16204), lambda a, b, c: a.addcdiv(b, c, value=-0.37)),
    ("add", (48918, 16353), lambda a, b: a.add(b, alpha=0.37)),
]


def tensor(bits):
    signed = bits - 0x10000 if bits >= 0x8000 else bits  # the uint16 bits as int16
    return torch.full((33,), signed, dtype=torch.int16).view(torch.bfloat16)


def main():
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    for name, ins, op in CASES:
        out = op(*(tensor(b) for b in ins)).view(torch.int16).to(torch.int32) & 0xFFFF
        print(f"{name:8s} {ins} body={int(out[0])} tail={int(out[32])}")
    one = torch.ones(1, dtype=torch.bfloat16)
    three = torch.full((1,), 3.0, dtype=torch.bfloat16)
    print("mul_(1 + 3*2**-9) of 3:", three.mul_(1 + 3 * 2.0**-9).item())
    print("add_(2**-8 + 2**-17) to 1:", one.add_(2.0**-8 + 2.0**-17).item())


if __name__ == "__main__":
    main()
