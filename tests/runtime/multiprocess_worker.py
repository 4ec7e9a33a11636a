"""One process of the multi-process runtime test (run by test_multiprocess.py):

    python -m tests.runtime.multiprocess_worker <coordinator host:port> <process id>

Each process brings 4 CPU devices; together they form the 8-device mesh {"B":4, "M":2},
so B spans both processes. The process runs hand-built PartIR:HLO programs through the
runtime, with inputs assembled from per-process tiles (`jax.make_array_from_callback`) or
given as the same host array in every process, and checks its own tiles of the results
against numpy. It prints one `ok` line per check, and exits non-zero on any failure.
"""

from __future__ import annotations

import os
import sys

# Before jax is imported: this process's share of the devices, and only CPUs.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import numpy as np

from partir.runtime import build_callable
from tests.runtime.programs import Builder, chain_program, chain_reference, normal


def check_local_tiles(out, want, what):
    assert out.shape == want.shape, (what, out.shape, want.shape)
    shards = out.addressable_shards
    assert len(shards) == 4, (what, len(shards))
    for shard in shards:
        np.testing.assert_allclose(np.asarray(shard.data), want[shard.index],
                                   rtol=1e-4, atol=1e-4, err_msg=what)
    print(f"ok {what}: {len(shards)} tiles", flush=True)


def from_callback(exe, args):
    """The global arguments, each process providing only its devices' tiles."""
    return [jax.make_array_from_callback(x.shape, sharding, lambda index, x=x: x[index])
            for x, sharding in zip(args, exe.input_shardings, strict=True)]


def all_to_all_program():
    """Rows split over (B, M) turned into columns split over (M, B), and a reduce_scatter
    over the major axis B, which crosses the processes."""
    b = Builder()
    x = b.arg("x", (64, 32), (("B", "M"), ()))
    y = b.collective("all_to_all", x, (64, 4), split_dim=1, concat_dim=0, axes=("B", "M"))
    s = b.collective("reduce_scatter", x, (2, 32), axes=(("B",), ()), monoid="add")
    return b.build([y, s], [((), ("B", "M")), (("M", "B"), ())])


def main(coordinator: str, process_id: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # The coordinator would bind every interface by default; loopback is enough here.
    # (Gloo's TCP transport binds the address the host name resolves to.)
    jax.distributed.initialize(coordinator_address=coordinator,
                               coordinator_bind_address=coordinator, num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    assert jax.process_count() == 2 and jax.device_count() == 8
    assert jax.local_device_count() == 4

    for fsdp in (False, True):
        exe = build_callable(chain_program(fsdp))
        args = [normal((256, 8), 0), normal((8, 16), 1), normal((16, 8), 2)]
        (out,) = exe(*from_callback(exe, args))
        check_local_tiles(out, chain_reference(*args), f"chain fsdp={fsdp} from tiles")
        (out,) = exe(*args)
        check_local_tiles(out, chain_reference(*args), f"chain fsdp={fsdp} from host arrays")

    exe = build_callable(all_to_all_program())
    x = normal((64, 32), 3)
    y, s = exe(*from_callback(exe, [x]))
    check_local_tiles(y, x, "all_to_all across processes")
    # device (b, m) holds the B-tile sum of row block m; tiles are ordered (M, B)
    want = x.reshape(4, 2, 8, 32).sum(0).reshape(16, 32)
    check_local_tiles(s, want, "reduce_scatter across processes")

    jax.distributed.shutdown()


if __name__ == "__main__":
    try:
        main(sys.argv[1], int(sys.argv[2]))
    except BaseException as e:
        print(f"worker failed: {e!r}", file=sys.stderr, flush=True)
        raise
