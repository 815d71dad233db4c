"""One remote writer process of tests/multiprocess/test_remote_processes.py.

    python remote_worker.py ADDRESS FIRST COUNT BATCH [RETRIES]

Connects with `gj.remote.Writer(ADDRESS)`, prints "ready", then inserts rows with ids FIRST, FIRST + 1, ...
in batches of BATCH (COUNT rows in all; COUNT < 0: until killed), each row's payload filled with
`payload_byte(id)`; prints the first id of every batch the server acknowledged, one per line, flushed
(a process killed later has reported every batch that was written but the one in flight).
"""

import sys

import numpy as np

import gear_jax as gj


def payload_byte(ids):
    return (np.asarray(ids) % 251).astype(np.uint8)


def main() -> None:
    address, first, count, batch, *rest = sys.argv[1:]
    first, count, batch = int(first), int(count), int(batch)
    retries = int(rest[0]) if rest else 5
    with gj.remote.Writer(address, retries=retries, retry_wait_s=0.05) as writer:
        item_bytes = writer.spec.fields["payload"].shape[0]
        print("ready", flush=True)
        start = first
        while count < 0 or start < first + count:
            n = batch if count < 0 else min(batch, first + count - start)
            ids = np.arange(start, start + n, dtype=np.int64)
            payload = np.repeat(payload_byte(ids)[:, None], item_bytes, axis=1)
            writer.insert({"id": ids, "payload": payload}, timeout=60)
            print(start, flush=True)
            start += n


if __name__ == "__main__":
    main()
