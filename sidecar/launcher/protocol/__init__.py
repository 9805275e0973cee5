"""The run-dir protocol (docs/run-dir-protocol.md): names, limits and records, defined once for the
launcher that writes or reads them and the sidecar that reads or writes them.

``names``, ``fields``, ``go``, ``records`` and ``exit`` are pure (the sidecar's core imports them);
``files`` (how a record is written and read) and ``fds`` (how an fd table is read and classified)
do the I/O both sides must do the same way.
"""
