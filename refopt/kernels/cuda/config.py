"""Launch configuration of the CUDA kernels: one place, read at every launch.

Tests shrink ``THREADS_PER_BLOCK`` (e.g. to 4) so that small arrays span several blocks and
the grid-stride loops, the block reductions and the row ownership are exercised across block
boundaries under the simulator. It must be a power of two (the norm reduction halves it).
Kernels are compiled once per value (the reductions size their shared memory with it).
"""

#: Threads per block of every kernel (a power of two; 256 on a GPU).
THREADS_PER_BLOCK = 256
#: Upper bound on the blocks of an elementwise launch; larger arrays are covered by the
#: grid-stride loop (the result does not depend on it: every element is computed alone).
MAX_BLOCKS = 65535
#: Elements each thread adds in a norm reduction before the block's tree reduction. The
#: partial sums are per fixed tile of ``THREADS_PER_BLOCK * ITEMS_PER_THREAD`` elements.
ITEMS_PER_THREAD = 8
#: Tensors per launch of the multi-tensor kernels (``adam_multi``, ``sgd_multi``). Each is
#: two array arguments (variable and gradient, 56 bytes of descriptor each for a 1-d array)
#: and CUDA's kernel parameter space is 4 KiB: 24 tensors take 2688 bytes, leaving room for
#: the slot buffers, the tables and the scalars (about 600 bytes). The tuples are always
#: padded to this length, so each dtype compiles one kernel whatever the number of tensors.
TENSORS_PER_LAUNCH = 24
