"""Serves a table of this host to remote writers (`gj.remote.Writer`) from a process of its own.

    python -m gear_jax.serve --table=NAME [--port=5005] [--host=127.0.0.1]
    python -m gear_jax.serve --table=NAME --shards=0,1    # shards NAME.shard0, NAME.shard1 (ShardedTable)
    GEAR_JAX_SERVE_TOKEN=... python -m gear_jax.serve --table=NAME --host=0.0.0.0 [--tls_cert=C --tls_key=K]

The table is created by another process (the learner: `gj.Table.create(spec, name=NAME)`, or a
`ShardedTable`); this process attaches to it by name and serves it until SIGTERM or SIGINT, then closes
the server (the table stays with its creator). The token, required beyond the loopback, comes from the
environment variable GEAR_JAX_SERVE_TOKEN or from --token_file (never from the command line, which other
users of the host can read). With --address_file the address (port 0 picks a free port) is written there
once the server listens.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from typing import Any

from absl import app, flags, logging

TOKEN_VARIABLE = "GEAR_JAX_SERVE_TOKEN"

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined only when it runs (importing this module defines none)."""
    flags.DEFINE_string("table", None, "name of the table to serve (of the ShardedTable, with --shards)")
    flags.DEFINE_list("shards", None, "serve these shards of the ShardedTable --table (e.g. 0,1)")
    flags.DEFINE_string("host", "127.0.0.1", "address to listen on; beyond the loopback a token is required")
    flags.DEFINE_integer("port", 0, "port to listen on; 0 picks a free one (see --address_file)")
    flags.DEFINE_string("token_file", None, f"file holding the shared secret (default: ${TOKEN_VARIABLE})")
    flags.DEFINE_string("tls_cert", None, "PEM certificate file: serve over TLS (with --tls_key)")
    flags.DEFINE_string("tls_key", None, "PEM private key file of --tls_cert")
    flags.DEFINE_integer("max_message_bytes", 256 << 20, "the largest insert message the server takes")
    flags.DEFINE_string("address_file", None, "write the server's address to this file once it listens")
    flags.mark_flag_as_required("table")


def _token() -> str | None:
    if FLAGS.token_file:
        with open(FLAGS.token_file) as f:
            return f.read().strip()
    return os.environ.get(TOKEN_VARIABLE) or None


def main(argv: list[str]) -> None:
    del argv
    import gear_jax as gj

    if (FLAGS.tls_cert is None) != (FLAGS.tls_key is None):
        raise app.UsageError("--tls_cert and --tls_key go together")
    if FLAGS.shards:
        try:
            shards = [int(s) for s in FLAGS.shards]
        except ValueError:
            raise app.UsageError(f"--shards={','.join(FLAGS.shards)} must be shard indices") from None
        tables = {s: gj.ShardedTable.attach_shard(FLAGS.table, s) for s in shards}
    else:
        tables = {None: gj.Table.attach(FLAGS.table)}
    tls = (FLAGS.tls_cert, FLAGS.tls_key) if FLAGS.tls_cert else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    served = tables[None] if None in tables else tables
    server = None
    try:
        with gj.serve(served, FLAGS.host, FLAGS.port, _token(), tls, FLAGS.max_message_bytes) as server:
            if FLAGS.address_file:
                temporary = f"{FLAGS.address_file}.tmp"
                with open(temporary, "w") as f:
                    f.write(server.address + "\n")
                os.replace(temporary, FLAGS.address_file)
            logging.info("serving %s (shards %s) at %s", FLAGS.table, server.shard_list(), server.address)
            while not stop.wait(1.0):
                pass
            logging.info("stopping: %s", server.stats)
    finally:
        for table in tables.values():
            table.close()
    if server is not None and server.open_streams:  # pyarrow's server would wait for the writers' streams
        logging.warning("%d streams still open: exiting without them", server.open_streams)
        logging.flush()
        os._exit(0)


class _CallableModule(types.ModuleType):
    """`gj.serve` is the function `gear_jax.remote.serve`; a program that imports this module (which
    makes `gear_jax.serve` the module) can still call it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from gear_jax.remote import serve

        return serve(*args, **kwargs)


if __name__ == "__main__":
    define_flags()
    app.run(main)
else:
    sys.modules[__name__].__class__ = _CallableModule
