"""The soak launcher: runs the trainer for soak-sidecar inside the trainer's own container.

Standard library only, for the trainer image's Python (``protocol.names.MIN_PYTHON`` or newer).
``soak-sidecar install-launcher`` packs this package into one zipapp file, which the trainer
container runs as ``python3 /soak/bin/soak-launcher.py --run-dir /soak/run -- CMD ARGS...``;
local mode runs the same built file.

The sidecar imports only ``sidecar.launcher.protocol`` (the run-dir records, both sides' one
definition); everything else here runs in the trainer's container. Modules import each other
relatively, so the package runs under any top-level name inside the zipapp.
"""
